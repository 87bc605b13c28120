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
    /// The plugin could be replaced by another user.
    #[error(
        "refusing to load {path}: it {why}, and a plugin is code this process runs; run `chmod go-w` on it (or fix its owner), or set {PLUGIN_ENV} to a plugin you trust"
    )]
    Untrusted {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
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
/// `~/.cache/tessera` (as `.ci/setup.sh` computes it; the JIT's tuning file
/// lives there too, so the rule is [`lowering::cache_dir`]'s).
pub fn cache_dir() -> PathBuf {
    lowering::cache_dir()
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
    if !path.is_file() {
        return Err(PluginError::NotFound { path, why });
    }
    if std::env::var_os(PLUGIN_ENV).is_none() {
        check_trusted(&path, &cache_dir())?;
    }
    Ok(path)
}

/// A plugin is code this process runs: one found in the cache folder must
/// not be replaceable by other users. The file and every folder from it up
/// to `root` must be owned by this user (or root) and not writable by
/// group or others; a folder of ours that is too open is tightened
/// (`chmod go-w`), anything else is refused with the fix.
pub fn check_trusted(path: &Path, root: &Path) -> Result<(), PluginError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    let mut at = Some(path);
    while let Some(p) = at {
        let meta = std::fs::metadata(p).map_err(|e| PluginError::Untrusted {
            path: p.to_path_buf(),
            why: format!("cannot be read ({e})"),
        })?;
        if meta.uid() != me && meta.uid() != 0 {
            return Err(PluginError::Untrusted {
                path: p.to_path_buf(),
                why: format!("is owned by another user (uid {})", meta.uid()),
            });
        }
        let mode = meta.mode();
        if mode & 0o022 != 0 {
            let tightened = meta.uid() == me
                && std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & !0o022))
                    .is_ok();
            if !tightened {
                return Err(PluginError::Untrusted {
                    path: p.to_path_buf(),
                    why: format!("is writable by other users (mode {:o})", mode & 0o777),
                });
            }
        }
        if p == root {
            break;
        }
        at = p.parent();
    }
    Ok(())
}

/// What a plugin says about itself ([`PluginInfo::probe`] loads it, in
/// `pjrt`: finding and checking files is this module's, loading them
/// that one's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    /// The file.
    pub path: PathBuf,
    /// PJRT C API major version.
    pub major: i32,
    /// PJRT C API minor version.
    pub minor: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_others_can_replace_is_tightened_or_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tessera-trust-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("pjrt")).unwrap();
        let so = dir.join("pjrt").join("x.so");
        std::fs::write(&so, b"x").unwrap();
        std::fs::set_permissions(dir.join("pjrt"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o666)).unwrap();
        // Ours: tightened, then trusted.
        check_trusted(&so, &dir).unwrap();
        let mode = std::fs::metadata(dir.join("pjrt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o022, 0, "{mode:o}");
        assert_eq!(
            std::fs::metadata(&so).unwrap().permissions().mode() & 0o022,
            0
        );
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
