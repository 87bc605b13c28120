//! Probing a plugin file: loading it (once per process) and reading what
//! it says about itself. Here, beside the loader, so that `plugin` (finding
//! and checking files) needs nothing from `pjrt`.

use std::path::Path;

use super::{PjrtError, Plugin};

impl crate::plugin::PluginInfo {
    /// Loads the plugin (once per process), checks its PJRT C API version
    /// and initializes it.
    pub fn probe(path: &Path) -> Result<crate::plugin::PluginInfo, crate::plugin::PluginError> {
        match Plugin::load(path) {
            Ok(p) => Ok(crate::plugin::PluginInfo {
                path: p.path.clone(),
                major: p.version.0,
                minor: p.version.1,
            }),
            Err(PjrtError::Load(e)) => Err(std::sync::Arc::unwrap_or_clone(e)),
            Err(e) => Err(crate::plugin::PluginError::NotAPlugin {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_installed_cpu_plugin_is_found_and_speaks_a_supported_api() {
        let path = crate::plugin::locate().expect("run .ci/setup.sh first");
        let info = crate::plugin::PluginInfo::probe(&path).unwrap();
        assert_eq!(info.major, 0);
        assert!(info.minor >= crate::plugin::MIN_MINOR, "{info:?}");
    }

    #[test]
    fn a_file_that_is_not_a_plugin_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("tessera-plugin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("fake.so");
        std::fs::write(&fake, b"not an ELF file").unwrap();
        let e = crate::plugin::PluginInfo::probe(&fake).unwrap_err();
        assert!(
            matches!(e, crate::plugin::PluginError::NotAPlugin { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("fake.so"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
