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
#[derive(Debug, Clone, thiserror::Error)]
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

impl PluginInfo {
    /// Loads the plugin (once per process), checks its PJRT C API version
    /// and initializes it.
    pub fn probe(path: &Path) -> Result<PluginInfo, PluginError> {
        match crate::pjrt::Plugin::load(path) {
            Ok(p) => Ok(PluginInfo {
                path: p.path.clone(),
                major: p.version.0,
                minor: p.version.1,
            }),
            Err(crate::pjrt::PjrtError::Load(e)) => Err(std::sync::Arc::unwrap_or_clone(e)),
            Err(e) => Err(PluginError::NotAPlugin {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        }
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
