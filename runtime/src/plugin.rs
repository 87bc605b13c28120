//! Finding a PJRT plugin and checking what it is.

use std::path::{Path, PathBuf};

/// Environment variable that names the PJRT plugin to use.
pub const PLUGIN_ENV: &str = "TESSERA_PJRT_PLUGIN";

/// Where `.ci/setup.sh` unpacks the CPU plugin, under the cache folder.
pub const CPU_PLUGIN_SUBPATH: &str = "pjrt/cpu-0.11.2/pjrt_c_api_cpu_plugin.so";

/// The PJRT C API major version Tessera's bindings target.
pub const SUPPORTED_MAJOR: i32 = 0;
/// The oldest PJRT C API minor version Tessera's bindings accept.
pub const MIN_MINOR: i32 = 81;

/// Why a plugin could not be found or used.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No plugin at the configured or default path.
    #[error(
        "no PJRT plugin at {path} ({why}); run .ci/setup.sh to install the CPU plugin, or set {PLUGIN_ENV} to a plugin .so"
    )]
    NotFound {
        /// The path looked at.
        path: PathBuf,
        /// Where the path came from.
        why: &'static str,
    },
    /// The file is not a loadable PJRT plugin.
    #[error("{path} is not a loadable PJRT plugin: {reason}")]
    NotAPlugin {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The plugin speaks a PJRT C API version the bindings do not.
    #[error(
        "{path} implements PJRT C API {major}.{minor}, but Tessera needs {SUPPORTED_MAJOR}.x with x ≥ {MIN_MINOR}; use the plugin .ci/setup.sh installs"
    )]
    Incompatible {
        /// The file.
        path: PathBuf,
        /// Its major version.
        major: i32,
        /// Its minor version.
        minor: i32,
    },
}

/// The cache folder: `$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`, else
/// `~/.cache/tessera` (as `.ci/setup.sh` computes it).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TESSERA_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("tessera");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("tessera")
}

/// The plugin to use: `$TESSERA_PJRT_PLUGIN` if set, else the CPU plugin in
/// the cache folder. Errors say how to fix a missing plugin.
pub fn locate() -> Result<PathBuf, PluginError> {
    let (path, why) = match std::env::var_os(PLUGIN_ENV) {
        Some(p) => (PathBuf::from(p), "from $TESSERA_PJRT_PLUGIN"),
        None => (
            cache_dir().join(CPU_PLUGIN_SUBPATH),
            "the default CPU plugin path",
        ),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(PluginError::NotFound { path, why })
    }
}

/// What a plugin says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    /// The file.
    pub path: PathBuf,
    /// PJRT C API major version.
    pub major: i32,
    /// PJRT C API minor version.
    pub minor: i32,
}

/// The head of `PJRT_Api` (pjrt_c_api.h): its size, the extension chain and
/// the API version, which every PJRT C API version lays out the same way.
#[repr(C)]
struct ApiHead {
    struct_size: usize,
    extension_start: *const std::ffi::c_void,
    version_struct_size: usize,
    version_extension_start: *const std::ffi::c_void,
    major: i32,
    minor: i32,
}

impl PluginInfo {
    /// Loads the plugin, calls `GetPjrtApi` and reads its API version.
    ///
    /// The library stays loaded for the life of the process: PJRT plugins
    /// register process-wide state and must not be unloaded.
    pub fn probe(path: &Path) -> Result<PluginInfo, PluginError> {
        let bad = |reason: String| PluginError::NotAPlugin {
            path: path.to_path_buf(),
            reason,
        };
        // SAFETY: loading a shared library runs its initializers; the file
        // is the PJRT plugin the user or the set-up chose.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| bad(e.to_string()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const ApiHead> =
            unsafe { lib.get(b"GetPjrtApi\0") }.map_err(|e| bad(e.to_string()))?;
        // SAFETY: the plugin returns a pointer to its static PJRT_Api, or null.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(bad("GetPjrtApi returned null".into()));
        }
        // SAFETY: non-null and points at a PJRT_Api, whose head is ApiHead;
        // struct_size is checked before reading past the first field.
        let head = unsafe { &*api };
        if head.struct_size < std::mem::size_of::<ApiHead>() {
            return Err(bad(format!("PJRT_Api is only {} bytes", head.struct_size)));
        }
        let info = PluginInfo {
            path: path.to_path_buf(),
            major: head.major,
            minor: head.minor,
        };
        std::mem::forget(lib);
        if info.major != SUPPORTED_MAJOR || info.minor < MIN_MINOR {
            return Err(PluginError::Incompatible {
                path: info.path,
                major: info.major,
                minor: info.minor,
            });
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_cpu_plugin_is_found_and_speaks_a_supported_api() {
        let path = locate().expect("run .ci/setup.sh first");
        let info = PluginInfo::probe(&path).unwrap();
        assert_eq!(info.major, 0);
        assert!(info.minor >= MIN_MINOR, "{info:?}");
    }

    #[test]
    fn a_file_that_is_not_a_plugin_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("tessera-plugin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("fake.so");
        std::fs::write(&fake, b"not an ELF file").unwrap();
        let e = PluginInfo::probe(&fake).unwrap_err();
        assert!(matches!(e, PluginError::NotAPlugin { .. }), "{e}");
        assert!(e.to_string().contains("fake.so"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_plugin_says_how_to_fix_it() {
        let e = PluginError::NotFound {
            path: "/nowhere/x.so".into(),
            why: "from $TESSERA_PJRT_PLUGIN",
        };
        assert!(e.to_string().contains(".ci/setup.sh"), "{e}");
    }
}
