//! The library behind `ferry run`: preloaded into an unmodified program, it
//! makes the paths under each mount prefix remote (ORFA's interposition).
//!
//! Structure: `hooks/*` are the exported C functions, thin and `unsafe` at
//! the edge; `ops` and `open` are the safe logic; `state` the process-wide
//! tables; `placeholder` the memfd that gives each remote file a real fd; `maps`
//! the shared pages behind `mmap(MAP_SHARED)`;
//! `mounts` the pure path logic; `real` finds libc's own functions.
//!
//! The mount table comes from `FERRY_MOUNTS` (`/prefix=ferry://host:port/path`,
//! `;`-separated); the token as for every ferry client.

pub mod attrs;
pub mod conv;
pub mod guard;
pub mod hooks;
pub mod lent;
pub mod links;
pub mod locks;
pub mod maps;
pub mod mounts;
pub mod namespace;
pub mod open;
pub mod ops;
pub mod placeholder;
pub mod real;
pub mod samehost;
pub mod state;
pub mod sync;

extern "C" fn on_load() {
    hooks::process::init();
}

extern "C" fn on_unload() {
    hooks::process::fini();
}

// The loader runs these around `main`: set up before the program's first
// call, write gathered data through at exit.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = on_unload;
