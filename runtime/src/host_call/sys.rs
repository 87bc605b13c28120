//! The parts of the XLA FFI C API (`xla/ffi/api/c_api.h`, API 0.4) the
//! host-kernel handler touches, laid out as the header lays them out.

#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// `XLA_FFI_Extension_Metadata`.
pub const EXTENSION_METADATA: c_int = 1;
pub const API_MAJOR: c_int = 0;
pub const API_MINOR: c_int = 4;

pub const ARG_BUFFER: c_int = 1;
pub const RET_BUFFER: c_int = 1;
pub const ATTR_STRING: c_int = 4;

pub const ERROR_INVALID_ARGUMENT: c_int = 3;
pub const ERROR_NOT_FOUND: c_int = 5;
pub const ERROR_INTERNAL: c_int = 13;

pub const DTYPE_PRED: c_int = 1;
pub const DTYPE_S8: c_int = 2;
pub const DTYPE_S32: c_int = 4;
pub const DTYPE_F16: c_int = 10;
pub const DTYPE_F32: c_int = 11;
pub const DTYPE_BF16: c_int = 16;
pub const DTYPE_F8E5M2: c_int = 19;
pub const DTYPE_F8E4M3FN: c_int = 20;

#[repr(C)]
pub struct InternalExtension {
    pub struct_size: usize,
    pub kind: c_int,
    pub next: *mut InternalExtension,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub major: c_int,
    pub minor: c_int,
}

#[repr(C)]
pub struct Metadata {
    pub struct_size: usize,
    pub api_version: ApiVersion,
    pub traits: u32,
    pub state_type_id: i64,
}

#[repr(C)]
pub struct MetadataExtension {
    pub base: InternalExtension,
    pub metadata: *mut Metadata,
}

#[repr(C)]
pub struct ErrorCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub message: *const c_char,
    pub errc: c_int,
}

pub type ErrorCreate = unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut c_void;

/// The head of `XLA_FFI_Api`, up to the first function Tessera calls.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub api_version: ApiVersion,
    pub internal_api: *const c_void,
    pub error_create: Option<ErrorCreate>,
}

#[repr(C)]
pub struct Buffer {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub dtype: c_int,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *const i64,
}

#[repr(C)]
pub struct Args {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub size: i64,
    pub types: *const c_int,
    pub args: *const *mut c_void,
}

#[repr(C)]
pub struct ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct Attrs {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub size: i64,
    pub types: *const c_int,
    pub names: *const *const ByteSpan,
    pub attrs: *const *mut c_void,
}

#[repr(C)]
pub struct CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut InternalExtension,
    pub api: *const Api,
    pub ctx: *mut c_void,
    pub stage: c_int,
    pub args: Args,
    pub rets: Args,
    pub attrs: Attrs,
    pub future: *mut c_void,
}

/// `XLA_FFI_Handler`.
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut c_void;
