//! Where the shared secret comes from, in order: an explicit file,
//! `FERRY_TOKEN_FILE`, `FERRY_TOKEN`, then the default file
//! (`$XDG_CONFIG_HOME/ferry/token` or `~/.config/ferry/token`).

use std::path::{Path, PathBuf};

/// ferry's configuration directory: `$XDG_CONFIG_HOME/ferry`, else
/// `~/.config/ferry` (the token, known servers, the server's certificate).
pub fn config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("ferry"))
}

/// The default token file path.
pub fn default_token_file() -> Option<PathBuf> {
    config_dir().map(|d| d.join("token"))
}

/// Reads a token file; surrounding whitespace is not part of the token.
pub fn read_token_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let s = std::fs::read(path)?;
    let t = String::from_utf8_lossy(&s).trim().as_bytes().to_vec();
    if t.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: empty token", path.display())));
    }
    Ok(t)
}

/// Finds the client's token. `Ok(None)` means none is configured (fine for
/// a server without authentication); an unreadable explicit file is an error.
pub fn find_client_token(explicit: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
    let read = |p: &Path| read_token_file(p).map(Some).map_err(|e| format!("token file {}: {e}", p.display()));
    if let Some(p) = explicit {
        return read(p);
    }
    if let Some(p) = std::env::var_os("FERRY_TOKEN_FILE").filter(|v| !v.is_empty()) {
        return read(Path::new(&p));
    }
    if let Some(t) = std::env::var_os("FERRY_TOKEN").filter(|v| !v.is_empty()) {
        return Ok(Some(t.to_string_lossy().trim().as_bytes().to_vec()));
    }
    match default_token_file() {
        Some(p) if p.exists() => read(&p),
        _ => Ok(None),
    }
}
