//! Compile-only targets: a topology description of devices that need not be
//! attached, and the unloaded executables compiled against it.
//!
//! This is how a TPU compiler (libtpu) compiles on a machine with no TPU:
//! `PJRT_TopologyDescription_Create` names a slice (`v6e:2x2`), and
//! `PJRT_Compile` compiles a StableHLO module for it without a client. The
//! result is a `PJRT_Executable`: it cannot run here, but it reports its
//! memory use and cost, and serializes to bytes a host with the devices
//! can load.

use std::ffi::c_char;
use std::sync::Arc;

use super::{CompileOptions, PjrtError, Plugin, serialize_executable, str_of, sys};

/// A topology description created by a plugin, for compiling without the
/// devices attached.
pub struct Topology {
    plugin: Arc<Plugin>,
    raw: *mut sys::TopologyDescription,
    /// The name it was created from (`v6e:2x2`).
    pub name: String,
    /// The platform it describes (`tpu`).
    pub platform: String,
    /// The platform version string.
    pub platform_version: String,
    /// How many devices it has.
    pub num_devices: usize,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Topology({} on {}, {} devices)",
            self.name, self.platform, self.num_devices
        )
    }
}

// SAFETY: a topology description is immutable after creation, and the PJRT
// C API allows it to be used from any thread.
unsafe impl Send for Topology {}
unsafe impl Sync for Topology {}

impl Drop for Topology {
    fn drop(&mut self) {
        let mut a = sys::TopologyDestroyArgs::new();
        a.topology = self.raw;
        let _ = self.plugin.call(
            self.plugin.api.topology_description_destroy,
            &mut a,
            "topology destroy",
        );
    }
}

impl Topology {
    /// Asks `plugin` for the topology called `name` (for libtpu, e.g.
    /// `v5e:2x2`, `v6e:2x2`, `v5p:2x2x1`, `tpu7x:2x2x1`).
    pub fn new(plugin: Arc<Plugin>, name: &str) -> Result<Topology, PjrtError> {
        let mut a = sys::TopologyCreateArgs::new();
        a.topology_name = name.as_ptr() as *const c_char;
        a.topology_name_size = name.len();
        plugin.call(
            plugin.api.topology_description_create,
            &mut a,
            "topology creation",
        )?;
        let mut topo = Topology {
            plugin: plugin.clone(),
            raw: a.topology,
            name: name.to_string(),
            platform: String::new(),
            platform_version: String::new(),
            num_devices: 0,
        };
        let mut p = sys::TopologyStringArgs::new();
        p.topology = topo.raw;
        plugin.call(
            plugin.api.topology_description_platform_name,
            &mut p,
            "topology platform name",
        )?;
        topo.platform = str_of(p.string, p.string_size);
        let mut v = sys::TopologyStringArgs::new();
        v.topology = topo.raw;
        plugin.call(
            plugin.api.topology_description_platform_version,
            &mut v,
            "topology platform version",
        )?;
        topo.platform_version = str_of(v.string, v.string_size);
        let mut d = sys::TopologyDeviceDescriptionsArgs::new();
        d.topology = topo.raw;
        plugin.call(
            plugin.api.topology_description_get_device_descriptions,
            &mut d,
            "topology devices",
        )?;
        topo.num_devices = d.num_descriptions;
        Ok(topo)
    }

    /// The plugin that made it.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// Compiles a StableHLO module (text or bytecode) for this topology.
    pub fn compile(
        &self,
        module: &[u8],
        options: &CompileOptions,
    ) -> Result<UnloadedExecutable, PjrtError> {
        let program = sys::Program::mlir(module);
        let opts = options.to_proto();
        let mut a = sys::CompileArgs::new();
        a.topology = self.raw;
        a.program = &program;
        a.compile_options = opts.as_ptr() as *const c_char;
        a.compile_options_size = opts.len();
        let p = &self.plugin;
        p.call(p.api.compile, &mut a, "compilation")?;
        Ok(UnloadedExecutable {
            plugin: p.clone(),
            raw: a.executable,
        })
    }
}

/// Memory a compiled program uses on its device, as the compiler reports
/// it (`xla::CompiledMemoryStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompiledMemoryStats {
    /// Generated code.
    pub generated_code_bytes: i64,
    /// Arguments.
    pub argument_bytes: i64,
    /// Outputs.
    pub output_bytes: i64,
    /// Argument bytes reused for outputs.
    pub alias_bytes: i64,
    /// Temporaries.
    pub temp_bytes: i64,
    /// Peak device memory.
    pub peak_bytes: i64,
}

/// A compiled program that is not loaded on any device (`PJRT_Executable`).
pub struct UnloadedExecutable {
    plugin: Arc<Plugin>,
    raw: *mut sys::Executable,
}

impl std::fmt::Debug for UnloadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UnloadedExecutable")
    }
}

// SAFETY: PJRT executables are immutable, thread-safe handles.
unsafe impl Send for UnloadedExecutable {}
unsafe impl Sync for UnloadedExecutable {}

impl Drop for UnloadedExecutable {
    fn drop(&mut self) {
        let mut a = sys::ExecutableDestroyArgs::new();
        a.executable = self.raw;
        let _ = self.plugin.call(
            self.plugin.api.executable_destroy,
            &mut a,
            "executable destroy",
        );
    }
}

impl UnloadedExecutable {
    /// Size of the generated code in bytes.
    pub fn code_size(&self) -> Result<i64, PjrtError> {
        let mut a = sys::ExecutableCodeSizeArgs::new();
        a.executable = self.raw;
        let p = &self.plugin;
        p.call(
            p.api.executable_size_of_generated_code_in_bytes,
            &mut a,
            "code size",
        )?;
        Ok(a.size_in_bytes)
    }

    /// Device memory the program needs.
    pub fn memory_stats(&self) -> Result<CompiledMemoryStats, PjrtError> {
        let mut a = sys::CompiledMemoryStatsArgs::new();
        a.executable = self.raw;
        let p = &self.plugin;
        p.call(
            p.api.executable_get_compiled_memory_stats,
            &mut a,
            "compiled memory stats",
        )?;
        Ok(CompiledMemoryStats {
            generated_code_bytes: a.generated_code_size_in_bytes,
            argument_bytes: a.argument_size_in_bytes,
            output_bytes: a.output_size_in_bytes,
            alias_bytes: a.alias_size_in_bytes,
            temp_bytes: a.temp_size_in_bytes,
            peak_bytes: a.peak_memory_in_bytes,
        })
    }

    /// The compiler's cost analysis: named properties (`flops`,
    /// `bytes accessed`, ...), each as a number.
    pub fn cost_analysis(&self) -> Result<Vec<(String, f64)>, PjrtError> {
        let mut a = sys::ExecutableCostAnalysisArgs::new();
        a.executable = self.raw;
        let p = &self.plugin;
        p.call(p.api.executable_get_cost_analysis, &mut a, "cost analysis")?;
        if a.properties.is_null() || a.num_properties == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned `num_properties` named values owned by
        // the executable; they are copied before it can go away.
        let props = unsafe { std::slice::from_raw_parts(a.properties, a.num_properties) };
        let mut out = Vec::with_capacity(props.len());
        for v in props {
            let name = str_of(v.name, v.name_size);
            let value = match v.kind {
                sys::NAMED_INT64 => v.value as f64,
                // The union holds a 32-bit float in its low bytes.
                sys::NAMED_FLOAT => f32::from_bits(v.value as u64 as u32) as f64,
                sys::NAMED_BOOL => f64::from((v.value as u8) & 1),
                _ => continue,
            };
            out.push((name, value));
        }
        out.sort_by(|x, y| x.0.cmp(&y.0));
        Ok(out)
    }

    /// The compiled program as bytes, loadable (with
    /// `PJRT_Executable_DeserializeAndLoad`) by a client of the same plugin
    /// version that has the devices.
    pub fn serialize(&self) -> Result<Vec<u8>, PjrtError> {
        serialize_executable(&self.plugin, self.raw)
    }
}
