//! `ferry URL MOUNTPOINT -o OPTIONS`: the form mount(8) helpers are run in
//! (`mount -t fuse.ferry URL DIR`, an /etc/fstab line with type
//! `fuse.ferry`), through /sbin/mount.fuse.ferry or fuse3's `mount.fuse3`,
//! which runs `ferry URL DIR -o OPTIONS` itself. Translated into
//! `ferry mount --background ...`: mount(8) waits for its helper, which
//! must return once the mount is ready.

use std::ffi::OsString;

/// `args` (the whole command line) in `ferry mount` form, if it is a
/// mount helper's call; else `args` unchanged.
pub fn translate(args: Vec<OsString>) -> Vec<OsString> {
    let is_url = |a: &OsString| a.to_str().is_some_and(|s| s.starts_with("ferry://") || s.starts_with("ferry+unix://"));
    if args.len() < 3 || !is_url(&args[1]) || args[2].to_str().is_some_and(|s| s.starts_with('-')) {
        return args;
    }
    let mut opts = Vec::new();
    let mut rest = args[3..].iter();
    while let Some(a) = rest.next() {
        match a.to_str() {
            Some("-o") => opts.extend(rest.next().and_then(|o| o.to_str()).map(str::to_string)),
            Some(o) if o.starts_with("-o") => opts.push(o[2..].to_string()),
            // -n (no mtab), -s (sloppy), -v, -f: nothing for us to do.
            _ => {}
        }
    }
    let mut out: Vec<OsString> = vec![args[0].clone()];
    let mut flags: Vec<OsString> = vec!["mount".into(), "--background".into()];
    let mut extra = Vec::new();
    for o in opts.iter().flat_map(|o| o.split(',')) {
        let (key, value) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        match (key, value) {
            ("", _) => {}
            // Read by mount(8) or systemd only, or the kernel's defaults.
            ("defaults" | "rw" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "users" | "nouser", None) => {}
            ("owner" | "group" | "suid" | "dev" | "exec" | "async", None) => {}
            ("comment", _) => {}
            (k, _) if k.starts_with("x-") => {}
            ("ro", None) => flags.push("--read-only".into()),
            ("allow_other", None) => flags.push("--allow-other".into()),
            ("cache", None) => flags.push("--cache".into()),
            ("hard", None) => flags.push("--hard".into()),
            ("token_file", Some(f)) => out.extend(["--token-file".into(), f.into()]),
            ("attr_timeout", Some(s)) => flags.extend(["--attr-timeout".into(), s.into()]),
            ("entry_timeout", Some(s)) => flags.extend(["--entry-timeout".into(), s.into()]),
            ("lease_timeout", Some(s)) => flags.extend(["--lease-timeout".into(), s.into()]),
            _ => extra.push(o.to_string()),
        }
    }
    out.extend(flags);
    if !extra.is_empty() {
        out.extend(["-o".into(), extra.join(",").into()]);
    }
    out.extend([args[1].clone(), args[2].clone()]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Vec<String> {
        translate(args.iter().map(OsString::from).collect()).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn helper_calls_become_background_mounts() {
        assert_eq!(
            t(&[
                "ferry",
                "ferry://h:7070/d",
                "/mnt",
                "-o",
                "rw,noauto,_netdev,ro,token_file=/t,noexec,x-systemd.automount"
            ]),
            [
                "ferry",
                "--token-file",
                "/t",
                "mount",
                "--background",
                "--read-only",
                "-o",
                "noexec",
                "ferry://h:7070/d",
                "/mnt"
            ]
        );
        assert_eq!(t(&["ferry", "ferry://h/", "/mnt"]), ["ferry", "mount", "--background", "ferry://h/", "/mnt"]);
        // Anything else is an ordinary command line.
        assert_eq!(t(&["ferry", "ls", "ferry://h/"]), ["ferry", "ls", "ferry://h/"]);
        assert_eq!(t(&["ferry", "ferry://h/", "-x"]), ["ferry", "ferry://h/", "-x"]);
    }
}
