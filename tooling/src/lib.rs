//! What runs the library: comparisons, benchmarks, file formats and the
//! demo model. Nothing here defines a kernel.

pub mod atomic_dir;
pub mod atomic_file;
pub mod bench;
pub mod cost;
pub mod diff;
pub mod estimate;
pub mod export;
pub mod hostile;
pub mod npy;
pub mod numerics;
pub mod paths;
pub mod profile;
pub mod resources;
pub mod train;
pub mod transformer;
