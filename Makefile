# Builds and installs ferry: the binary, the preload library `ferry run`
# loads (found in ../lib/ferry from the binary), and optionally the mount(8)
# helper (`mount -t fuse.ferry`, /etc/fstab) and a systemd unit. The man
# pages and shell completions are made by the built `ferry` from the same
# tables as its --help (`ferry man --dir`, `ferry completions SHELL`).
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
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
CARGO ?= cargo

.PHONY: build install install-mount-helper install-systemd uninstall

build:
	$(CARGO) build --release --workspace

install: build
	install -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(LIBDIR)"
	install -m 755 target/release/ferry "$(DESTDIR)$(BINDIR)/ferry"
	install -m 644 target/release/libferry_preload.so "$(DESTDIR)$(LIBDIR)/libferry_preload.so"
	target/release/ferry man --dir "$(DESTDIR)$(MANDIR)/man1"
	install -d "$(DESTDIR)$(BASHCOMPDIR)" "$(DESTDIR)$(ZSHCOMPDIR)" "$(DESTDIR)$(FISHCOMPDIR)"
	target/release/ferry completions bash > "$(DESTDIR)$(BASHCOMPDIR)/ferry"
	target/release/ferry completions zsh > "$(DESTDIR)$(ZSHCOMPDIR)/_ferry"
	target/release/ferry completions fish > "$(DESTDIR)$(FISHCOMPDIR)/ferry.fish"
	@echo "installed $(BINDIR)/ferry, $(LIBDIR)/libferry_preload.so, man pages in $(MANDIR)/man1 and shell completions"

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
	rm -f "$(DESTDIR)$(MANDIR)"/man1/ferry.1 "$(DESTDIR)$(MANDIR)"/man1/ferry-*.1 \
	      "$(DESTDIR)$(BASHCOMPDIR)/ferry" "$(DESTDIR)$(ZSHCOMPDIR)/_ferry" "$(DESTDIR)$(FISHCOMPDIR)/ferry.fish"
	-rmdir "$(DESTDIR)$(LIBDIR)"
