//! Raw PJRT C API types (`pjrt_c_api.h`), declared by hand.
//!
//! Layouts follow the header of PJRT C API 0.81; the plugin Tessera uses
//! speaks 0.115. The API only ever appends fields, so the 0.81 layout is a
//! prefix of the newer one. Every argument struct ends in zeroed reserved
//! space and reports its full size, so a newer plugin's size check passes
//! and the fields it knows that we do not read as zero: "not set".

#![allow(non_camel_case_types, dead_code, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

pub type Fn = unsafe extern "C" fn(*mut c_void) -> *mut Error;

#[repr(C)]
pub struct Error {
    _p: [u8; 0],
}
#[repr(C)]
pub struct Client {
    _p: [u8; 0],
}
#[repr(C)]
pub struct Device {
    _p: [u8; 0],
}
#[repr(C)]
pub struct DeviceDescription {
    _p: [u8; 0],
}
#[repr(C)]
pub struct Buffer {
    _p: [u8; 0],
}
#[repr(C)]
pub struct Event {
    _p: [u8; 0],
}
#[repr(C)]
pub struct LoadedExecutable {
    _p: [u8; 0],
}
#[repr(C)]
pub struct Executable {
    _p: [u8; 0],
}

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub kind: c_int,
    pub next: *const ExtensionBase,
}

/// `PJRT_Extension_Type_FFI`.
pub const EXTENSION_FFI: c_int = 5;

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *const c_void,
    pub major: c_int,
    pub minor: c_int,
}

/// The head of `PJRT_Api` up to the last function Tessera calls.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *const ExtensionBase,
    pub version: ApiVersion,
    pub error_destroy: Option<Fn>,
    pub error_message: Option<Fn>,
    pub error_get_code: Option<Fn>,
    pub plugin_initialize: Option<Fn>,
    pub plugin_attributes: Option<Fn>,
    pub event_destroy: Option<Fn>,
    pub event_is_ready: Option<Fn>,
    pub event_error: Option<Fn>,
    pub event_await: Option<Fn>,
    pub event_on_ready: Option<Fn>,
    pub client_create: Option<Fn>,
    pub client_destroy: Option<Fn>,
    pub client_platform_name: Option<Fn>,
    pub client_process_index: Option<Fn>,
    pub client_platform_version: Option<Fn>,
    pub client_devices: Option<Fn>,
    pub client_addressable_devices: Option<Fn>,
    pub client_lookup_device: Option<Fn>,
    pub client_lookup_addressable_device: Option<Fn>,
    pub client_addressable_memories: Option<Fn>,
    pub client_compile: Option<Fn>,
    pub client_default_device_assignment: Option<Fn>,
    pub client_buffer_from_host_buffer: Option<Fn>,
    pub device_description_id: Option<Fn>,
    pub device_description_process_index: Option<Fn>,
    pub device_description_attributes: Option<Fn>,
    pub device_description_kind: Option<Fn>,
    pub device_description_debug_string: Option<Fn>,
    pub device_description_to_string: Option<Fn>,
    pub device_get_description: Option<Fn>,
    pub device_is_addressable: Option<Fn>,
    pub device_local_hardware_id: Option<Fn>,
    pub device_addressable_memories: Option<Fn>,
    pub device_default_memory: Option<Fn>,
    pub device_memory_stats: Option<Fn>,
    pub memory_id: Option<Fn>,
    pub memory_kind: Option<Fn>,
    pub memory_debug_string: Option<Fn>,
    pub memory_to_string: Option<Fn>,
    pub memory_addressable_by_devices: Option<Fn>,
    pub executable_destroy: Option<Fn>,
    pub executable_name: Option<Fn>,
    pub executable_num_replicas: Option<Fn>,
    pub executable_num_partitions: Option<Fn>,
    pub executable_num_outputs: Option<Fn>,
    pub executable_size_of_generated_code_in_bytes: Option<Fn>,
    pub executable_get_cost_analysis: Option<Fn>,
    pub executable_output_memory_kinds: Option<Fn>,
    pub executable_optimized_program: Option<Fn>,
    pub executable_serialize: Option<Fn>,
    pub loaded_executable_destroy: Option<Fn>,
    pub loaded_executable_get_executable: Option<Fn>,
    pub loaded_executable_addressable_devices: Option<Fn>,
    pub loaded_executable_delete: Option<Fn>,
    pub loaded_executable_is_deleted: Option<Fn>,
    pub loaded_executable_execute: Option<Fn>,
    pub executable_deserialize_and_load: Option<Fn>,
    pub loaded_executable_fingerprint: Option<Fn>,
    pub buffer_destroy: Option<Fn>,
    pub buffer_element_type: Option<Fn>,
    pub buffer_dimensions: Option<Fn>,
    pub buffer_unpadded_dimensions: Option<Fn>,
    pub buffer_dynamic_dimension_indices: Option<Fn>,
    pub buffer_get_memory_layout: Option<Fn>,
    pub buffer_on_device_size_in_bytes: Option<Fn>,
    pub buffer_device: Option<Fn>,
    pub buffer_memory: Option<Fn>,
    pub buffer_delete: Option<Fn>,
    pub buffer_is_deleted: Option<Fn>,
    pub buffer_copy_to_device: Option<Fn>,
    pub buffer_to_host_buffer: Option<Fn>,
    pub buffer_is_on_cpu: Option<Fn>,
    pub buffer_ready_event: Option<Fn>,
    pub buffer_unsafe_pointer: Option<Fn>,
    pub buffer_increase_external_reference_count: Option<Fn>,
    pub buffer_decrease_external_reference_count: Option<Fn>,
    pub buffer_opaque_device_memory_data_pointer: Option<Fn>,
    pub copy_to_device_stream_destroy: Option<Fn>,
    pub copy_to_device_stream_add_chunk: Option<Fn>,
    pub copy_to_device_stream_total_bytes: Option<Fn>,
    pub copy_to_device_stream_granule_size: Option<Fn>,
    pub copy_to_device_stream_current_bytes: Option<Fn>,
    pub topology_description_create: Option<Fn>,
    pub topology_description_destroy: Option<Fn>,
    pub topology_description_platform_name: Option<Fn>,
    pub topology_description_platform_version: Option<Fn>,
    pub topology_description_get_device_descriptions: Option<Fn>,
    pub topology_description_serialize: Option<Fn>,
    pub topology_description_attributes: Option<Fn>,
    pub compile: Option<Fn>,
    pub executable_output_element_types: Option<Fn>,
    pub executable_output_dimensions: Option<Fn>,
    pub buffer_copy_to_memory: Option<Fn>,
    pub client_create_view_of_device_buffer: Option<Fn>,
    pub executable_fingerprint: Option<Fn>,
    pub client_topology_description: Option<Fn>,
    pub executable_get_compiled_memory_stats: Option<Fn>,
}

/// Declares an argument struct: size and extension fields, the given
/// fields, then reserved zeroed space for fields newer plugins added.
macro_rules! args {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *const c_void,
            $(pub $field: $ty,)*
            _reserved: [u64; 16],
        }
        impl $name {
            /// Zeroed, with `struct_size` set.
            pub fn new() -> Self {
                // SAFETY: every field is an integer, a raw pointer or an
                // optional function pointer, for which all-zero is valid.
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = std::mem::size_of::<Self>();
                s
            }
        }
    };
}

args!(ErrorDestroyArgs { error: *mut Error });
args!(ErrorMessageArgs { error: *const Error, message: *const c_char, message_size: usize });
args!(ErrorGetCodeArgs { error: *const Error, code: c_int });
args!(PluginInitializeArgs {});
args!(EventDestroyArgs { event: *mut Event });
args!(EventAwaitArgs { event: *mut Event });

#[repr(C)]
pub struct NamedValue {
    pub struct_size: usize,
    pub extension_start: *const c_void,
    pub name: *const c_char,
    pub name_size: usize,
    pub kind: c_int,
    /// The union: an i64 value, or a pointer for strings and arrays.
    pub value: i64,
    pub value_size: usize,
}

// PJRT_NamedValue_Type values.
pub const NAMED_STRING: c_int = 0;
pub const NAMED_INT64: c_int = 1;
pub const NAMED_INT64_LIST: c_int = 2;
pub const NAMED_FLOAT: c_int = 3;
pub const NAMED_BOOL: c_int = 4;

args!(ClientCreateArgs {
    create_options: *const NamedValue,
    num_options: usize,
    kv_get_callback: *const c_void,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: *const c_void,
    kv_put_user_arg: *mut c_void,
    client: *mut Client,
    kv_try_get_callback: *const c_void,
    kv_try_get_user_arg: *mut c_void,
});
args!(ClientDestroyArgs { client: *mut Client });
args!(ClientStringArgs { client: *mut Client, string: *const c_char, string_size: usize });
args!(ClientDevicesArgs { client: *mut Client, devices: *const *mut Device, num_devices: usize });

#[repr(C)]
pub struct Program {
    pub struct_size: usize,
    pub extension_start: *const c_void,
    pub code: *const c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}

impl Program {
    /// A StableHLO module (text or bytecode) in PJRT's `mlir` format; it
    /// borrows `module`, which must outlive the compile call.
    pub fn mlir(module: &[u8]) -> Program {
        const FORMAT: &str = "mlir";
        Program {
            struct_size: std::mem::size_of::<Program>(),
            extension_start: std::ptr::null(),
            code: module.as_ptr() as *const c_char,
            code_size: module.len(),
            format: FORMAT.as_ptr() as *const c_char,
            format_size: FORMAT.len(),
        }
    }
}

args!(ClientCompileArgs {
    client: *mut Client,
    program: *const Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut LoadedExecutable,
});
args!(BufferFromHostArgs {
    client: *mut Client,
    data: *const c_void,
    kind: c_int,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: c_int,
    device: *mut Device,
    memory: *mut c_void,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut Event,
    buffer: *mut Buffer,
});
args!(DeviceGetDescriptionArgs { device: *mut Device, description: *mut DeviceDescription });
args!(DescriptionIdArgs { description: *mut DeviceDescription, id: c_int });
args!(DescriptionStringArgs { description: *mut DeviceDescription, string: *const c_char, string_size: usize });
args!(ExecutableDestroyArgs { executable: *mut Executable });
args!(ExecutableNumOutputsArgs { executable: *mut Executable, num_outputs: usize });
args!(ExecutableNumReplicasArgs { executable: *mut Executable, num_replicas: usize });
args!(ExecutableSerializeArgs {
    executable: *const Executable,
    bytes: *const c_char,
    size: usize,
    serialized: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut c_void)>,
});
args!(DeserializeAndLoadArgs {
    client: *mut Client,
    bytes: *const c_char,
    size: usize,
    loaded: *mut LoadedExecutable,
    options: *const c_char,
    options_size: usize,
});
args!(LoadedExecutableDestroyArgs { executable: *mut LoadedExecutable });
args!(LoadedExecutableGetExecutableArgs { loaded: *mut LoadedExecutable, executable: *mut Executable });
args!(ExecuteOptions {
    send_callbacks: *const c_void,
    recv_callbacks: *const c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut c_void,
});
args!(ExecuteArgs {
    executable: *mut LoadedExecutable,
    options: *mut ExecuteOptions,
    argument_lists: *const *const *mut Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut Buffer,
    device_complete_events: *mut *mut Event,
    execute_device: *mut Device,
});
#[repr(C)]
pub struct TopologyDescription {
    _p: [u8; 0],
}

args!(TopologyCreateArgs {
    topology_name: *const c_char,
    topology_name_size: usize,
    create_options: *const NamedValue,
    num_options: usize,
    topology: *mut TopologyDescription,
});
args!(TopologyDestroyArgs { topology: *mut TopologyDescription });
args!(TopologyStringArgs {
    topology: *const TopologyDescription,
    string: *const c_char,
    string_size: usize,
});
args!(TopologyDeviceDescriptionsArgs {
    topology: *const TopologyDescription,
    descriptions: *const *mut DeviceDescription,
    num_descriptions: usize,
});
args!(CompileArgs {
    topology: *const TopologyDescription,
    program: *const Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    client: *mut Client,
    executable: *mut Executable,
});
args!(ExecutableCodeSizeArgs { executable: *mut Executable, size_in_bytes: i64 });
args!(ExecutableCostAnalysisArgs {
    executable: *mut Executable,
    num_properties: usize,
    properties: *const NamedValue,
});
args!(CompiledMemoryStatsArgs {
    executable: *mut Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
});
args!(BufferDestroyArgs { buffer: *mut Buffer });
args!(BufferElementTypeArgs { buffer: *mut Buffer, kind: c_int });
args!(BufferDimensionsArgs { buffer: *mut Buffer, dims: *const i64, num_dims: usize });
args!(BufferToHostArgs {
    src: *mut Buffer,
    host_layout: *mut c_void,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut Event,
});

/// `PJRT_HostBufferSemantics_kImmutableOnlyDuringCall`: the plugin copies
/// the host data before the call returns.
pub const HOST_BUFFER_COPY_DURING_CALL: c_int = 0;

// PJRT_Buffer_Type values.
pub const TYPE_PRED: c_int = 1;
pub const TYPE_S8: c_int = 2;
pub const TYPE_S32: c_int = 4;
pub const TYPE_F16: c_int = 10;
pub const TYPE_F32: c_int = 11;
pub const TYPE_BF16: c_int = 13;
pub const TYPE_F8E5M2: c_int = 16;
pub const TYPE_F8E4M3FN: c_int = 17;

/// The FFI extension (`pjrt_c_api_ffi_extension.h`).
#[repr(C)]
pub struct FfiExtension {
    pub base: ExtensionBase,
    pub type_id_register: Option<Fn>,
    pub user_data_add: Option<Fn>,
    pub register_handler: Option<Fn>,
}

/// `PJRT_FFI_Register_Handler_Args` as the pinned CPU plugin reads it (no
/// extension field, and no `api_version` field: newer headers add one
/// before `handler`, but this plugin reads the handler at offset 0x18 and
/// the platform name at 0x20, measured from its machine code). The plugin
/// only registers typed (XLA FFI) handlers.
#[repr(C)]
pub struct FfiRegisterHandlerArgs {
    pub struct_size: usize,
    pub target_name: *const c_char,
    pub target_name_size: usize,
    pub handler: *const c_void,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
    pub traits: u32,
    pub _reserved: [u64; 8],
}
