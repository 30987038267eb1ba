# Builds and installs ferry: the binary, the preload library `ferry run`
# loads (found in ../lib/ferry from the binary), and optionally the mount(8)
# helper (`mount -t fuse.ferry`, /etc/fstab) and a systemd unit.
#
#   make install PREFIX=~/.local             # as a user: ~/.local/bin/ferry
#   sudo make install                        # /usr/local/bin/ferry
#   sudo make install-mount-helper           # /sbin/mount.fuse.ferry
#   sudo make install-systemd                # /etc/systemd/system/ferry-serve@.service

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib/ferry
# mount(8) looks for helpers in /sbin only.
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system
CARGO ?= cargo

.PHONY: build install install-mount-helper install-systemd uninstall

build:
	$(CARGO) build --release --workspace

install: build
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)"
	install -m 755 target/release/ferry "$(DESTDIR)$(BINDIR)/ferry"
	install -m 644 target/release/libferry_preload.so "$(DESTDIR)$(LIBDIR)/libferry_preload.so"
	@echo "installed $(BINDIR)/ferry and $(LIBDIR)/libferry_preload.so"

install-mount-helper:
	install -d "$(DESTDIR)$(SBINDIR)"
	sed 's|@FERRY@|$(BINDIR)/ferry|' dist/mount.fuse.ferry > "$(DESTDIR)$(SBINDIR)/mount.fuse.ferry"
	chmod 755 "$(DESTDIR)$(SBINDIR)/mount.fuse.ferry"
	@echo "installed $(SBINDIR)/mount.fuse.ferry (mount -t fuse.ferry URL DIR)"

install-systemd:
	install -d "$(DESTDIR)$(UNITDIR)"
	sed 's|@FERRY@|$(BINDIR)/ferry|' dist/ferry-serve@.service > "$(DESTDIR)$(UNITDIR)/ferry-serve@.service"
	chmod 644 "$(DESTDIR)$(UNITDIR)/ferry-serve@.service"
	@echo "installed $(UNITDIR)/ferry-serve@.service"

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/ferry" "$(DESTDIR)$(LIBDIR)/libferry_preload.so" \
	      "$(DESTDIR)$(SBINDIR)/mount.fuse.ferry" "$(DESTDIR)$(UNITDIR)/ferry-serve@.service"
	-rmdir "$(DESTDIR)$(LIBDIR)"
