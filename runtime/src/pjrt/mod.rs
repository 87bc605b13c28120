//! Thin, safe bindings over the PJRT C API.
//!
//! A [`Plugin`] is a loaded PJRT plugin (never unloaded: plugins register
//! process-wide state); a [`Client`] owns devices, uploads [`Buffer`]s and
//! compiles StableHLO into [`Executable`]s. Everything is freed
//! deterministically by `Drop`, children keep their client alive, and all
//! types are `Send + Sync`: the PJRT C API is thread-safe for clients,
//! buffers and executables. Inputs are never donated, so executing does not
//! consume them.

mod compile_options;
mod probe;
pub(crate) mod sys;
mod topology;

pub use compile_options::CompileOptions;
pub use topology::{CompiledMemoryStats, Topology, UnloadedExecutable};

use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use kernel_ir::{Array, DType};

use crate::plugin::{MIN_MINOR, SUPPORTED_MAJOR};

/// An error from PJRT or from using it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PjrtError {
    /// The plugin reported an error.
    #[error("PJRT {what} failed: {message} (code {code})")]
    Plugin {
        /// What Tessera asked for.
        what: &'static str,
        /// The plugin's message.
        message: String,
        /// The PJRT (absl) status code.
        code: i32,
    },
    /// The plugin could not be loaded or is not compatible.
    #[error(transparent)]
    Load(#[from] Arc<crate::plugin::PluginError>),
    /// A misuse Tessera detects before calling PJRT.
    #[error("{0}")]
    Usage(String),
}

impl From<crate::plugin::PluginError> for PjrtError {
    fn from(e: crate::plugin::PluginError) -> Self {
        PjrtError::Load(Arc::new(e))
    }
}

/// A loaded PJRT plugin.
pub struct Plugin {
    api: &'static sys::Api,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// PJRT C API version it implements.
    pub version: (i32, i32),
}

// SAFETY: the PJRT_Api table is immutable after GetPjrtApi and its
// functions are thread-safe.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

fn loaded() -> &'static Mutex<Vec<Arc<Plugin>>> {
    static LOADED: OnceLock<Mutex<Vec<Arc<Plugin>>>> = OnceLock::new();
    LOADED.get_or_init(|| Mutex::new(Vec::new()))
}

fn str_of(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: PJRT returns (pointer, length) pairs that stay valid while
    // their owner lives; we copy right away.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

impl Plugin {
    /// Loads the plugin at `path` (once per process), checks its API version
    /// and initializes it.
    pub fn load(path: &Path) -> Result<Arc<Plugin>, PjrtError> {
        let mut all = loaded().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = all.iter().find(|p| p.path == path) {
            return Ok(p.clone());
        }
        let bad = |reason: String| crate::plugin::PluginError::NotAPlugin {
            path: path.to_path_buf(),
            reason,
        };
        // SAFETY: loading runs the library's initializers; it is the PJRT
        // plugin the user or the set-up chose.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| bad(e.to_string()))?;
        // SAFETY: every PJRT plugin exports `const PJRT_Api* GetPjrtApi()`.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const sys::Api> =
            unsafe { lib.get(b"GetPjrtApi\0") }.map_err(|e| bad(e.to_string()))?;
        // SAFETY: returns the plugin's static API table or null.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(bad("GetPjrtApi returned null".into()).into());
        }
        // The plugin stays loaded for the life of the process.
        std::mem::forget(lib);
        // SAFETY: non-null, static; struct_size is checked before fields
        // past the version are used.
        let api: &'static sys::Api = unsafe { &*api };
        let version = (api.version.major, api.version.minor);
        if version.0 != SUPPORTED_MAJOR || version.1 < MIN_MINOR {
            return Err(crate::plugin::PluginError::Incompatible {
                path: path.to_path_buf(),
                major: version.0,
                minor: version.1,
            }
            .into());
        }
        if api.struct_size < std::mem::size_of::<sys::Api>() {
            return Err(bad(format!("PJRT_Api is only {} bytes", api.struct_size)).into());
        }
        let plugin = Arc::new(Plugin {
            api,
            path: path.to_path_buf(),
            version,
        });
        let mut args = sys::PluginInitializeArgs::new();
        plugin.call(api.plugin_initialize, &mut args, "plugin initialization")?;
        all.push(plugin.clone());
        Ok(plugin)
    }

    /// The plugin `.ci/setup.sh` installs, or `$TESSERA_PJRT_PLUGIN`.
    pub fn default_plugin() -> Result<Arc<Plugin>, PjrtError> {
        Plugin::load(&crate::plugin::locate()?)
    }

    /// Turns a returned `PJRT_Error*` into a result, freeing it.
    fn check(&self, err: *mut sys::Error, what: &'static str) -> Result<(), PjrtError> {
        if err.is_null() {
            return Ok(());
        }
        let mut m = sys::ErrorMessageArgs::new();
        m.error = err;
        let mut c = sys::ErrorGetCodeArgs::new();
        c.error = err;
        // SAFETY: `err` is a live error from this plugin; the message is
        // copied before the error is destroyed.
        let (message, code) = unsafe {
            if let Some(f) = self.api.error_message {
                f(&mut m as *mut _ as *mut c_void);
            }
            // GetCode fails only on a bad error pointer; the code then
            // stays 0 and the message still says what went wrong.
            if let Some(f) = self.api.error_get_code {
                f(&mut c as *mut _ as *mut c_void);
            }
            (str_of(m.message, m.message_size), c.code)
        };
        let mut d = sys::ErrorDestroyArgs::new();
        d.error = err;
        // SAFETY: destroys the error exactly once.
        unsafe {
            if let Some(f) = self.api.error_destroy {
                f(&mut d as *mut _ as *mut c_void);
            }
        }
        Err(PjrtError::Plugin {
            what,
            message,
            code,
        })
    }

    /// Calls a PJRT function with an argument struct.
    fn call<A>(
        &self,
        f: Option<sys::Fn>,
        args: &mut A,
        what: &'static str,
    ) -> Result<(), PjrtError> {
        let f =
            f.ok_or_else(|| PjrtError::Usage(format!("the plugin does not implement {what}")))?;
        // SAFETY: `args` is the `#[repr(C)]` struct this function takes,
        // with `struct_size` set and unused fields zeroed.
        let err = unsafe { f(args as *mut A as *mut c_void) };
        self.check(err, what)
    }

    fn await_event(&self, event: *mut sys::Event, what: &'static str) -> Result<(), PjrtError> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = sys::EventAwaitArgs::new();
        a.event = event;
        let r = self.call(self.api.event_await, &mut a, what);
        let mut d = sys::EventDestroyArgs::new();
        d.event = event;
        let _ = self.call(self.api.event_destroy, &mut d, "event destroy");
        r
    }

    /// The FFI extension, if the plugin has one.
    pub(crate) fn ffi_extension(&self) -> Option<&'static sys::FfiExtension> {
        let mut ext = self.api.extension_start;
        while !ext.is_null() {
            // SAFETY: the extension chain is a static linked list owned by
            // the plugin.
            let base = unsafe { &*ext };
            if base.kind == sys::EXTENSION_FFI {
                // SAFETY: an extension of this kind is a PJRT_FFI_Extension.
                return Some(unsafe { &*(ext as *const sys::FfiExtension) });
            }
            ext = base.next;
        }
        None
    }

    /// Registers a typed XLA FFI handler for `platform` under `target`.
    pub fn register_ffi_handler(
        &self,
        target: &str,
        platform: &str,
        handler: *const c_void,
    ) -> Result<(), PjrtError> {
        let ext = self
            .ffi_extension()
            .ok_or_else(|| PjrtError::Usage("this PJRT plugin has no FFI extension".into()))?;
        let mut a = sys::FfiRegisterHandlerArgs {
            struct_size: std::mem::size_of::<sys::FfiRegisterHandlerArgs>(),
            target_name: target.as_ptr() as *const c_char,
            target_name_size: target.len(),
            handler,
            platform_name: platform.as_ptr() as *const c_char,
            platform_name_size: platform.len(),
            traits: 0,
            _reserved: [0; 8],
        };
        self.call(ext.register_handler, &mut a, "FFI handler registration")
    }
}

/// A device of a client.
#[derive(Clone, Debug)]
pub struct Device {
    raw: *mut sys::Device,
    /// Device id.
    pub id: i32,
    /// Device kind (e.g. `cpu`).
    pub kind: String,
}

// SAFETY: a device handle is an immutable pointer into the client.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

struct ClientInner {
    plugin: Arc<Plugin>,
    raw: *mut sys::Client,
    devices: Vec<Device>,
    platform: String,
    platform_version: String,
}

// SAFETY: PJRT clients are thread-safe.
unsafe impl Send for ClientInner {}
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut a = sys::ClientDestroyArgs::new();
        a.client = self.raw;
        let _ = self
            .plugin
            .call(self.plugin.api.client_destroy, &mut a, "client destroy");
    }
}

/// A PJRT client.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl Client {
    /// A client of `plugin` with integer create options (for the CPU
    /// plugin: `cpu_device_count`).
    pub fn new(plugin: Arc<Plugin>, options: &[(&str, i64)]) -> Result<Client, PjrtError> {
        let named: Vec<sys::NamedValue> = options
            .iter()
            .map(|(k, v)| sys::NamedValue {
                struct_size: std::mem::size_of::<sys::NamedValue>(),
                extension_start: std::ptr::null(),
                name: k.as_ptr() as *const c_char,
                name_size: k.len(),
                kind: sys::NAMED_INT64,
                value: *v,
                value_size: 1,
            })
            .collect();
        let mut a = sys::ClientCreateArgs::new();
        a.create_options = named.as_ptr();
        a.num_options = named.len();
        // Plugins log their set-up through absl straight to fd 2 (the CPU
        // plugin: two lines per client); kept off the terminal unless
        // `TESSERA_PLUGIN_LOG=1`.
        let (created, _log) = crate::plugin_log::capture_stderr(|| {
            plugin.call(plugin.api.client_create, &mut a, "client creation")
        });
        created?;
        let raw = a.client;
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw,
            devices: Vec::new(),
            platform: String::new(),
            platform_version: String::new(),
        };
        let mut n = sys::ClientStringArgs::new();
        n.client = raw;
        plugin.call(plugin.api.client_platform_name, &mut n, "platform name")?;
        inner.platform = str_of(n.string, n.string_size);
        let mut v = sys::ClientStringArgs::new();
        v.client = raw;
        plugin.call(
            plugin.api.client_platform_version,
            &mut v,
            "platform version",
        )?;
        inner.platform_version = str_of(v.string, v.string_size);
        let mut d = sys::ClientDevicesArgs::new();
        d.client = raw;
        plugin.call(plugin.api.client_addressable_devices, &mut d, "device list")?;
        // SAFETY: the plugin returns `num_devices` device pointers owned by
        // the client.
        let raws = unsafe { std::slice::from_raw_parts(d.devices, d.num_devices) };
        for &dev in raws {
            let mut g = sys::DeviceGetDescriptionArgs::new();
            g.device = dev;
            plugin.call(
                plugin.api.device_get_description,
                &mut g,
                "device description",
            )?;
            let mut id = sys::DescriptionIdArgs::new();
            id.description = g.description;
            plugin.call(plugin.api.device_description_id, &mut id, "device id")?;
            let mut kind = sys::DescriptionStringArgs::new();
            kind.description = g.description;
            plugin.call(plugin.api.device_description_kind, &mut kind, "device kind")?;
            inner.devices.push(Device {
                raw: dev,
                id: id.id,
                kind: str_of(kind.string, kind.string_size),
            });
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// A client of the CPU plugin with `devices` devices.
    pub fn cpu(devices: usize) -> Result<Client, PjrtError> {
        Client::with_devices(Plugin::default_plugin()?, devices)
    }

    /// A client of `plugin` asked for `devices` devices: the CPU plugin
    /// makes that many (`cpu_device_count`); a plugin that refuses the
    /// option (a GPU's: "Unexpected option name passed to
    /// PJRT_Client_Create", seen with JAX's CUDA plugin on an H200) gets
    /// none and has the devices it has.
    pub fn with_devices(plugin: Arc<Plugin>, devices: usize) -> Result<Client, PjrtError> {
        match Client::new(plugin.clone(), &[("cpu_device_count", devices as i64)]) {
            Err(e) if e.to_string().contains("cpu_device_count") => Client::new(plugin, &[]),
            other => other,
        }
    }

    /// The plugin behind this client.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    /// Platform name (`cpu`, `tpu`, ...).
    pub fn platform(&self) -> &str {
        &self.inner.platform
    }

    /// Platform version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// Addressable devices.
    pub fn devices(&self) -> &[Device] {
        &self.inner.devices
    }

    /// Copies a host array to device `device` (an index into
    /// [`Client::devices`]).
    pub fn upload(&self, array: &Array, device: usize) -> Result<Buffer, PjrtError> {
        let dev = self.inner.devices.get(device).ok_or_else(|| {
            PjrtError::Usage(format!(
                "device {device} does not exist; the client has {}",
                self.inner.devices.len()
            ))
        })?;
        let bytes = array.to_le_bytes();
        let dims: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
        let mut a = sys::BufferFromHostArgs::new();
        a.client = self.inner.raw;
        a.data = bytes.as_ptr() as *const c_void;
        a.kind = buffer_type(array.dtype());
        a.dims = dims.as_ptr();
        a.num_dims = dims.len();
        a.host_buffer_semantics = sys::HOST_BUFFER_COPY_DURING_CALL;
        a.device = dev.raw;
        let p = &self.inner.plugin;
        p.call(
            p.api.client_buffer_from_host_buffer,
            &mut a,
            "host-to-device copy",
        )?;
        p.await_event(a.done_with_host_buffer, "host-to-device copy")?;
        Ok(Buffer {
            client: self.inner.clone(),
            raw: a.buffer,
            dtype: array.dtype(),
            shape: array.shape().to_vec(),
        })
    }

    /// Compiles a StableHLO module (text or bytecode).
    pub fn compile(
        &self,
        module: &[u8],
        options: &CompileOptions,
    ) -> Result<Executable, PjrtError> {
        let program = sys::Program::mlir(module);
        let opts = options.to_proto();
        let mut a = sys::ClientCompileArgs::new();
        a.client = self.inner.raw;
        a.program = &program;
        a.compile_options = opts.as_ptr() as *const c_char;
        a.compile_options_size = opts.len();
        let p = &self.inner.plugin;
        p.call(p.api.client_compile, &mut a, "compilation")?;
        Executable::from_loaded(&self.inner, a.executable)
    }

    /// Loads an executable serialized by [`Executable::serialize`] with the
    /// same plugin version.
    pub fn deserialize(&self, bytes: &[u8]) -> Result<Executable, PjrtError> {
        let mut a = sys::DeserializeAndLoadArgs::new();
        a.client = self.inner.raw;
        a.bytes = bytes.as_ptr() as *const c_char;
        a.size = bytes.len();
        let p = &self.inner.plugin;
        p.call(
            p.api.executable_deserialize_and_load,
            &mut a,
            "executable deserialization",
        )?;
        Executable::from_loaded(&self.inner, a.loaded)
    }
}

/// A buffer on a device.
pub struct Buffer {
    client: Arc<ClientInner>,
    raw: *mut sys::Buffer,
    dtype: DType,
    shape: Vec<usize>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({}{:?})", self.dtype, self.shape)
    }
}

// SAFETY: PJRT buffers are thread-safe handles.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = sys::BufferDestroyArgs::new();
        a.buffer = self.raw;
        let p = &self.client.plugin;
        let _ = p.call(p.api.buffer_destroy, &mut a, "buffer destroy");
    }
}

impl Buffer {
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Copies the buffer to the host.
    pub fn to_host(&self) -> Result<Array, PjrtError> {
        let p = &self.client.plugin;
        let n: usize = self.shape.iter().product::<usize>() * self.dtype.bytes();
        let mut bytes = vec![0u8; n];
        let mut a = sys::BufferToHostArgs::new();
        a.src = self.raw;
        a.dst = bytes.as_mut_ptr() as *mut c_void;
        a.dst_size = n;
        p.call(p.api.buffer_to_host_buffer, &mut a, "device-to-host copy")?;
        p.await_event(a.event, "device-to-host copy")?;
        Array::from_le_bytes(self.dtype, self.shape.clone(), &bytes)
            .map_err(|e| PjrtError::Usage(format!("buffer holds the wrong number of bytes: {e}")))
    }

    fn from_raw(client: &Arc<ClientInner>, raw: *mut sys::Buffer) -> Result<Buffer, PjrtError> {
        let p = &client.plugin;
        let mut buffer = Buffer {
            client: client.clone(),
            raw,
            dtype: DType::F32,
            shape: Vec::new(),
        };
        let mut t = sys::BufferElementTypeArgs::new();
        t.buffer = raw;
        p.call(p.api.buffer_element_type, &mut t, "buffer element type")?;
        buffer.dtype = dtype_of(t.kind).ok_or_else(|| {
            PjrtError::Usage(format!(
                "the program returned PJRT element type {}, which Tessera does not handle",
                t.kind
            ))
        })?;
        let mut d = sys::BufferDimensionsArgs::new();
        d.buffer = raw;
        p.call(p.api.buffer_dimensions, &mut d, "buffer dimensions")?;
        // SAFETY: `num_dims` values owned by the buffer.
        let dims = unsafe { std::slice::from_raw_parts(d.dims, d.num_dims) };
        buffer.shape = dims.iter().map(|&x| x as usize).collect();
        Ok(buffer)
    }
}

/// A compiled program, loaded on its devices.
pub struct Executable {
    client: Arc<ClientInner>,
    raw: *mut sys::LoadedExecutable,
    num_outputs: usize,
    replicas: usize,
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Executable({} outputs, {} replicas)",
            self.num_outputs, self.replicas
        )
    }
}

// SAFETY: PJRT loaded executables are thread-safe.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut a = sys::LoadedExecutableDestroyArgs::new();
        a.executable = self.raw;
        let p = &self.client.plugin;
        let _ = p.call(
            p.api.loaded_executable_destroy,
            &mut a,
            "executable destroy",
        );
    }
}

impl Executable {
    /// Wraps a loaded executable (owning it from here on) and reads its
    /// output and replica counts.
    fn from_loaded(
        client: &Arc<ClientInner>,
        loaded: *mut sys::LoadedExecutable,
    ) -> Result<Executable, PjrtError> {
        let mut exe = Executable {
            client: client.clone(),
            raw: loaded,
            num_outputs: 0,
            replicas: 1,
        };
        let p = &client.plugin;
        let inner = exe.inner_executable()?;
        let mut n = sys::ExecutableNumOutputsArgs::new();
        n.executable = inner;
        let outputs = p.call(p.api.executable_num_outputs, &mut n, "output count");
        let mut r = sys::ExecutableNumReplicasArgs::new();
        r.executable = inner;
        let replicas = p.call(p.api.executable_num_replicas, &mut r, "replica count");
        exe.release_inner(inner);
        outputs?;
        replicas?;
        exe.num_outputs = n.num_outputs;
        exe.replicas = r.num_replicas.max(1);
        Ok(exe)
    }

    /// The `PJRT_Executable` behind the loaded one; release it with
    /// [`Executable::release_inner`].
    fn inner_executable(&self) -> Result<*mut sys::Executable, PjrtError> {
        let mut g = sys::LoadedExecutableGetExecutableArgs::new();
        g.loaded = self.raw;
        let p = &self.client.plugin;
        p.call(
            p.api.loaded_executable_get_executable,
            &mut g,
            "executable query",
        )?;
        Ok(g.executable)
    }

    fn release_inner(&self, inner: *mut sys::Executable) {
        let mut d = sys::ExecutableDestroyArgs::new();
        d.executable = inner;
        let p = &self.client.plugin;
        let _ = p.call(p.api.executable_destroy, &mut d, "executable release");
    }

    /// The compiled program as bytes, for [`Client::deserialize`] in this
    /// or another process with the same plugin version.
    pub fn serialize(&self) -> Result<Vec<u8>, PjrtError> {
        let inner = self.inner_executable()?;
        let r = serialize_executable(&self.client.plugin, inner);
        self.release_inner(inner);
        r
    }

    /// Number of outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Runs on one device with `args`; returns the outputs. The inputs are
    /// not consumed.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>, PjrtError> {
        let mut out = self.execute_replicated(&[args.to_vec()])?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Runs on every device the program was compiled for: `args[d]` are the
    /// arguments of device `d`; returns the outputs per device.
    pub fn execute_replicated(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>, PjrtError> {
        if args.len() != self.replicas {
            return Err(PjrtError::Usage(format!(
                "the program was compiled for {} devices but arguments for {} were given",
                self.replicas,
                args.len()
            )));
        }
        let num_args = args.first().map_or(0, Vec::len);
        if args.iter().any(|a| a.len() != num_args) {
            return Err(PjrtError::Usage(
                "every device needs the same number of arguments".into(),
            ));
        }
        let lists: Vec<Vec<*mut sys::Buffer>> = args
            .iter()
            .map(|a| a.iter().map(|b| b.raw).collect())
            .collect();
        let list_ptrs: Vec<*const *mut sys::Buffer> = lists.iter().map(|l| l.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut sys::Buffer>> = (0..args.len())
            .map(|_| vec![std::ptr::null_mut(); self.num_outputs])
            .collect();
        let out_ptrs: Vec<*mut *mut sys::Buffer> =
            outputs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let mut events: Vec<*mut sys::Event> = vec![std::ptr::null_mut(); args.len()];
        let keep: Vec<i64> = (0..num_args as i64).collect();
        let mut options = sys::ExecuteOptions::new();
        options.non_donatable_input_indices = keep.as_ptr();
        options.num_non_donatable_input_indices = keep.len();
        let mut a = sys::ExecuteArgs::new();
        a.executable = self.raw;
        a.options = &mut options;
        a.argument_lists = list_ptrs.as_ptr();
        a.num_devices = args.len();
        a.num_args = num_args;
        a.output_lists = out_ptrs.as_ptr();
        a.device_complete_events = events.as_mut_ptr();
        let p = &self.client.plugin;
        p.call(p.api.loaded_executable_execute, &mut a, "execution")?;
        let mut first_err = None;
        for e in events {
            if let Err(err) = p.await_event(e, "execution") {
                first_err.get_or_insert(err);
            }
        }
        // Wrap every output first so each is freed even on error.
        let wrapped: Vec<Vec<Result<Buffer, PjrtError>>> = outputs
            .into_iter()
            .map(|o| {
                o.into_iter()
                    .map(|raw| Buffer::from_raw(&self.client, raw))
                    .collect()
            })
            .collect();
        if let Some(e) = first_err {
            return Err(e);
        }
        wrapped
            .into_iter()
            .map(|o| o.into_iter().collect())
            .collect()
    }
}

/// `PJRT_Executable_Serialize` on `executable`, copying the bytes out and
/// freeing the plugin's copy.
pub(crate) fn serialize_executable(
    plugin: &Plugin,
    executable: *mut sys::Executable,
) -> Result<Vec<u8>, PjrtError> {
    let mut a = sys::ExecutableSerializeArgs::new();
    a.executable = executable;
    let r = plugin.call(
        plugin.api.executable_serialize,
        &mut a,
        "executable serialization",
    );
    let bytes = if r.is_ok() && !a.bytes.is_null() {
        // SAFETY: the plugin returned `size` bytes at `bytes`, alive until
        // the deleter runs.
        unsafe { std::slice::from_raw_parts(a.bytes as *const u8, a.size) }.to_vec()
    } else {
        Vec::new()
    };
    if let Some(del) = a.deleter
        && !a.serialized.is_null()
    {
        // SAFETY: called once on the object the plugin returned.
        unsafe { del(a.serialized) };
    }
    r?;
    Ok(bytes)
}

fn buffer_type(d: DType) -> i32 {
    match d {
        DType::F32 => sys::TYPE_F32,
        DType::BF16 => sys::TYPE_BF16,
        DType::F16 => sys::TYPE_F16,
        DType::I32 => sys::TYPE_S32,
        DType::I8 => sys::TYPE_S8,
        DType::Bool => sys::TYPE_PRED,
        DType::F8E4M3FN => sys::TYPE_F8E4M3FN,
        DType::F8E5M2 => sys::TYPE_F8E5M2,
    }
}

fn dtype_of(t: i32) -> Option<DType> {
    Some(match t {
        sys::TYPE_F32 => DType::F32,
        sys::TYPE_BF16 => DType::BF16,
        sys::TYPE_F16 => DType::F16,
        sys::TYPE_S32 => DType::I32,
        sys::TYPE_S8 => DType::I8,
        sys::TYPE_PRED => DType::Bool,
        sys::TYPE_F8E4M3FN => DType::F8E4M3FN,
        sys::TYPE_F8E5M2 => DType::F8E5M2,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
