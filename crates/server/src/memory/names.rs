//! The memory backend's name space: walking a path (symlinks followed as
//! the kernel does), making nodes, and what a rename or an exchange does
//! to the tree. The `Backend` calls in `mod.rs` take the name-space lock
//! and call these.

use super::*;

impl MemoryBackend {
    pub(super) fn parent_of(&self, dir: &Arc<Inode>) -> Arc<Inode> {
        let parent = dir.st().dir().and_then(|d| d.parent.upgrade());
        parent.unwrap_or_else(|| dir.clone())
    }

    pub(super) fn lookup_child(&self, dir: &Arc<Inode>, name: &[u8]) -> Result<Option<Arc<Inode>>> {
        if name.len() > NAME_MAX {
            return Err(Errno::NAMETOOLONG);
        }
        let st = dir.st();
        let d = st.dir().ok_or(Errno::NOTDIR)?;
        Ok(d.get(name).cloned())
    }

    /// Resolves the symlink `link` found in `dir`, following everything.
    pub(super) fn follow(&self, dir: &Arc<Inode>, link: &Inode, hops: &mut u32) -> Result<Arc<Inode>> {
        *hops += 1;
        if *hops > MAX_SYMLINKS {
            return Err(Errno::LOOP);
        }
        let target = link.target();
        if target.is_empty() {
            return Err(Errno::NOENT);
        }
        let start = if target.starts_with(b"/") { self.root.clone() } else { dir.clone() };
        self.resolve_from(start, &target, true, hops)
    }

    /// Walks `comps` from `dir`, every one of which must lead to a directory.
    pub(super) fn walk_dirs(&self, mut dir: Arc<Inode>, comps: &[&[u8]], hops: &mut u32) -> Result<Arc<Inode>> {
        for &comp in comps {
            dir = match comp {
                b"." => dir,
                b".." => self.parent_of(&dir),
                name => {
                    let mut child = self.lookup_child(&dir, name)?.ok_or(Errno::NOENT)?;
                    if child.ftype == FType::Lnk {
                        child = self.follow(&dir, &child, hops)?;
                    }
                    if child.ftype != FType::Dir {
                        return Err(Errno::NOTDIR);
                    }
                    child
                }
            };
        }
        Ok(dir)
    }

    /// Resolves everything but the last component: the directory that holds
    /// it, the component, and whether a trailing slash followed it.
    /// Where a new node named by `path` goes: its directory and its name,
    /// `EEXIST` if the name is taken (or is the root, `.` or `..`), and
    /// with a trailing slash `ENOENT` unless `slash_ok` (`mkdir d/`).
    pub(super) fn free_name<'p>(&self, path: &'p [u8], slash_ok: bool) -> Result<(Arc<Inode>, &'p [u8])> {
        let (dir, last, trailing) = self.walk_parent(self.root.clone(), path, &mut 0)?;
        let Last::Name(name) = last else {
            return Err(Errno::EXIST);
        };
        if self.lookup_child(&dir, name)?.is_some() {
            return Err(Errno::EXIST);
        }
        if trailing && !slash_ok {
            return Err(Errno::NOENT);
        }
        Ok((dir, name))
    }

    pub(super) fn walk_parent<'p>(
        &self,
        start: Arc<Inode>,
        path: &'p [u8],
        hops: &mut u32,
    ) -> Result<(Arc<Inode>, Last<'p>, bool)> {
        let (comps, trailing) = split(path);
        let Some((&last, init)) = comps.split_last() else {
            return Ok((start, Last::Root, false));
        };
        let dir = self.walk_dirs(start, init, hops)?;
        let last = match last {
            b"." => Last::Dot,
            b".." => Last::DotDot,
            name => Last::Name(name),
        };
        Ok((dir, last, trailing))
    }

    pub(super) fn resolve_from(
        &self,
        start: Arc<Inode>,
        path: &[u8],
        follow: bool,
        hops: &mut u32,
    ) -> Result<Arc<Inode>> {
        let (dir, last, trailing) = self.walk_parent(start, path, hops)?;
        let node = match last {
            Last::Root | Last::Dot => dir,
            Last::DotDot => self.parent_of(&dir),
            Last::Name(name) => {
                let child = self.lookup_child(&dir, name)?.ok_or(Errno::NOENT)?;
                // A trailing slash asks for what the link points to.
                if child.ftype == FType::Lnk && (follow || trailing) {
                    self.follow(&dir, &child, hops)?
                } else {
                    child
                }
            }
        };
        if trailing && node.ftype != FType::Dir {
            return Err(Errno::NOTDIR);
        }
        Ok(node)
    }

    pub(super) fn resolve(&self, path: &[u8], follow: bool) -> Result<Arc<Inode>> {
        check_path(path)?;
        let _ns = self.ns_read();
        self.resolve_from(self.root.clone(), path, follow, &mut 0)
    }

    pub(super) fn node_inode(&self, node: Node<'_, MemoryFile>) -> Result<Arc<Inode>> {
        match node {
            Node::File(f) => Ok(f.inode.clone()),
            Node::Path(p) => self.resolve(p, true),
            Node::PathNoFollow(p) => self.resolve(p, false),
        }
    }

    /// A new inode owned by the server, taking its group (and, for a
    /// directory, the set-group-ID bit) from a set-group-ID parent as Linux
    /// does.
    pub(super) fn make_inode(
        &self,
        parent: &State,
        parent_arc: &Arc<Inode>,
        kind: NewKind,
        perm: u32,
        now: Time,
    ) -> Result<Arc<Inode>> {
        let ino = self.shared.take_inode()?;
        let (mut perm, mut gid) = (perm, self.gid);
        if parent.perm & S_ISGID != 0 {
            gid = parent.gid;
            if matches!(kind, NewKind::Dir) {
                perm |= S_ISGID;
            }
        }
        let (ftype, nlink, content) = match kind {
            NewKind::File => (FType::Reg, 1, Content::File(FileData::default())),
            NewKind::Dir => (FType::Dir, 2, Content::Dir(DirData::new(Arc::downgrade(parent_arc)))),
            NewKind::Symlink(t) => (FType::Lnk, 1, Content::Symlink(t)),
            NewKind::Special { ifmt, rdev } => (FType::Special, 1, Content::Special { ifmt, rdev }),
        };
        Ok(Arc::new(Inode {
            ino,
            ftype,
            shared: self.shared.clone(),
            st: Mutex::new(State {
                perm,
                nlink,
                uid: self.uid,
                gid,
                atime: now,
                mtime: now,
                ctime: now,
                xattrs: BTreeMap::new(),
                content,
            }),
        }))
    }

    /// Creates `name` in `dir`; the caller holds the namespace write lock and
    /// has checked that the name is free.
    pub(super) fn create(&self, dir: &Arc<Inode>, name: &[u8], kind: NewKind, perm: u32) -> Result<Arc<Inode>> {
        let t = now();
        let is_dir = matches!(kind, NewKind::Dir);
        let mut st = dir.st();
        if st.nlink == 0 {
            return Err(Errno::NOENT);
        }
        let inode = self.make_inode(&st, dir, kind, perm, t)?;
        st.dir_mut().ok_or(Errno::NOTDIR)?.insert(name, inode.clone());
        if is_dir {
            st.nlink += 1;
        }
        st.mtime = t;
        st.ctime = t;
        Ok(inode)
    }

    pub(super) fn is_empty_dir(inode: &Inode) -> bool {
        inode.st().dir().is_none_or(|d| d.entries.is_empty())
    }

    /// Walks up from `desc`: if `anc` is a proper ancestor, the child of
    /// `anc` on the way.
    pub(super) fn child_toward(&self, anc: &Arc<Inode>, desc: &Arc<Inode>) -> Option<Arc<Inode>> {
        let mut cur = desc.clone();
        loop {
            let parent = self.parent_of(&cur);
            if Arc::ptr_eq(&parent, &cur) {
                return None;
            }
            if Arc::ptr_eq(&parent, anc) {
                return Some(cur);
            }
            cur = parent;
        }
    }

    pub(super) fn apply_rename(
        &self,
        od: &Arc<Inode>,
        on: &[u8],
        nd: &Arc<Inode>,
        nn: &[u8],
        old: &Arc<Inode>,
        new: Option<&Arc<Inode>>,
    ) {
        let t = now();
        let same_dir = Arc::ptr_eq(od, nd);
        let old_is_dir = old.ftype == FType::Dir;
        if let Some(victim) = new {
            let victim_is_dir = victim.ftype == FType::Dir;
            {
                let mut st = victim.st();
                st.nlink = if victim_is_dir { 0 } else { st.nlink.saturating_sub(1) };
                st.ctime = t;
            }
            let mut st = nd.st();
            if let Some(d) = st.dir_mut() {
                d.remove(nn);
            }
            if victim_is_dir {
                st.nlink = st.nlink.saturating_sub(1);
            }
        }
        {
            let mut st = od.st();
            if let Some(d) = st.dir_mut() {
                d.remove(on);
            }
            if old_is_dir && !same_dir {
                st.nlink = st.nlink.saturating_sub(1);
            }
            st.mtime = t;
            st.ctime = t;
        }
        {
            let mut st = nd.st();
            if let Some(d) = st.dir_mut() {
                d.insert(nn, old.clone());
            }
            if old_is_dir && !same_dir {
                st.nlink += 1;
            }
            st.mtime = t;
            st.ctime = t;
        }
        let mut st = old.st();
        st.ctime = t;
        if let Some(d) = st.dir_mut() {
            d.parent = Arc::downgrade(nd);
        }
    }

    pub(super) fn apply_exchange(
        &self,
        od: &Arc<Inode>,
        on: &[u8],
        nd: &Arc<Inode>,
        nn: &[u8],
        a: &Arc<Inode>,
        b: &Arc<Inode>,
    ) {
        let t = now();
        let same_dir = Arc::ptr_eq(od, nd);
        let (a_dir, b_dir) = (a.ftype == FType::Dir, b.ftype == FType::Dir);
        // Each directory loses the `..` of the subdirectory leaving it and
        // gains the one arriving.
        let shift = |dir: &Arc<Inode>, leaving: bool, arriving: bool, name: &[u8], put: &Arc<Inode>| {
            let mut st = dir.st();
            if let Some(d) = st.dir_mut() {
                d.replace(name, put.clone());
            }
            if !same_dir {
                if leaving && !arriving {
                    st.nlink = st.nlink.saturating_sub(1);
                } else if arriving && !leaving {
                    st.nlink += 1;
                }
            }
            st.mtime = t;
            st.ctime = t;
        };
        shift(od, a_dir, b_dir, on, b);
        shift(nd, b_dir, a_dir, nn, a);
        for (inode, parent) in [(a, nd), (b, od)] {
            let mut st = inode.st();
            st.ctime = t;
            if let Some(d) = st.dir_mut() {
                d.parent = Arc::downgrade(parent);
            }
        }
    }
}
