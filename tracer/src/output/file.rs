//! Writing output files safely: mode 0600 (reports name the target's code
//! and memory), never through a symlink an attacker placed at the path, and
//! atomically (a viewer or a script never reads half a file).
use std::{
    fs::{self, OpenOptions},
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// Writes `bytes` to `path`: into a new private file next to it, then
/// renamed over it (a rename replaces a symlink at `path`, it does not
/// follow it).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let partial = partial_path(path);
    // A leftover from a killed run; unlink does not follow symlinks.
    let _ = fs::remove_file(&partial);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&partial)
        .with_context(|| format!("could not write {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_data())
        .and_then(|()| fs::rename(&partial, path))
        .with_context(|| format!("could not write {}", path.display()))
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tracer-file-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn private_and_replaces_existing_files() {
        let dir = scratch("private");
        let path = dir.join("report.json");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!partial_path(&path).exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn never_writes_through_a_symlink() {
        let dir = scratch("symlink");
        let victim = dir.join("victim");
        fs::write(&victim, "precious").unwrap();
        let path = dir.join("report.json");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        // A symlink planted at the temporary name is not followed either.
        std::os::unix::fs::symlink(&victim, partial_path(&path)).unwrap();
        write_private(&path, b"report").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(
            !fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "report");
        fs::remove_dir_all(dir).unwrap();
    }
}
