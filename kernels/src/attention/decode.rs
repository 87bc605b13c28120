//! Decode attention over a paged KV cache.
