use ferry_client::{token, Client, OpenOptions, Options};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7070".into());
    // The token as the CLI finds it: FERRY_TOKEN(_FILE), else ~/.config/ferry/token.
    let opts = Options { token: token::find_client_token(None)?, ..Options::default() };
    let c = Client::connect(&addr, &opts)?;
    let mut f = c.open("/notes.txt", OpenOptions::new().write(true).create(true).truncate(true))?;
    f.write_all(b"hello\n")?;
    f.close()?; // reports any write-behind error
    for e in c.read_dir("/")? {
        // Entries come with attributes; names are bytes, as on Unix.
        println!("{} {}", String::from_utf8_lossy(&e.name), e.attr.map_or(0, |a| a.size));
    }
    Ok(())
}
