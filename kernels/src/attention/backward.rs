//! Flash attention backward: `delta`, then dq and dk/dv kernels.
