//! Who you are and where a command runs, decided the same way for every command that touches a
//! user's data (`chat`, `research`, `memory`, `ingest`, `import-chat`):
//!
//! - `--server URL --key KEY`: that server, as the key's user.
//! - otherwise, when a `mnemo serve` holds the data directory: that server, as `--user NAME`
//!   (default the local user `dev`), through the local credential it left in the directory's
//!   owner-only lock file. The command says so on stderr.
//! - otherwise: embedded on the data directory, as `--user NAME` (default `dev`).

use std::net::SocketAddr;

use clap::Args;

use super::Failure;
use mnemo::auth::{DEV_USER, local_credential, validate_user_name};
use mnemo::config::Settings;
use mnemo::datadir;

#[derive(Debug, Clone, Default, Args)]
pub struct Target {
    /// A running server's base URL, e.g. http://127.0.0.1:8080 (the scheme may be left out).
    /// Without it, commands use the server that holds the data directory, or run embedded.
    #[arg(long, env = "MNEMO_SERVER", global = true)]
    pub server: Option<String>,
    /// API key for --server; the key says who you are.
    #[arg(long, env = "MNEMO_KEY", global = true, hide_env_values = true)]
    pub key: Option<String>,
    /// Who you are on this machine's data directory (embedded, or through the server that
    /// holds it); the user must exist (`mnemo user add NAME`). Default: the local user "dev".
    #[arg(long, env = "MNEMO_USER", global = true)]
    pub user: Option<String>,
}

/// Where a command goes.
#[derive(Debug)]
pub enum Route {
    /// An HTTP server, with the bearer token to send.
    Remote { base: String, bearer: String },
    /// This process, on the data directory, as the named user.
    Embedded { user: String },
}

/// Decides where the command goes (see the module doc) and says so on stderr when it talks to
/// the server holding the data directory.
pub fn route(settings: &Settings, target: &Target) -> Result<Route, Failure> {
    let user = match target.user.as_deref() {
        None => DEV_USER.to_string(),
        Some(name) if name == DEV_USER => name.to_string(),
        Some(name) => {
            validate_user_name(name).map_err(Failure::usage)?;
            name.to_string()
        }
    };
    let held = datadir::probe(&settings.data_dir);
    let local_server = held.as_ref().and_then(|holder| {
        let holder = holder.as_ref()?;
        Some((reachable(holder.address.as_deref()?)?, holder))
    });
    if let Some(server) = &target.server {
        let base = base_url(server)?;
        if let Some(key) = &target.key {
            if target.user.is_some() {
                return Err(Failure::usage(
                    "--user names a user of this machine's data directory; with --key the key \
                     says who you are",
                ));
            }
            return Ok(Route::Remote {
                base,
                bearer: key.clone(),
            });
        }
        // The server holding our own data directory needs no key.
        if let Some((address, holder)) = &local_server
            && same_server(&base, address)
            && let Some(secret) = &holder.local_token
        {
            return Ok(Route::Remote {
                base,
                bearer: local_credential(secret, &user),
            });
        }
        return Err(Failure::usage(format!(
            "--server {server} needs --key KEY (or MNEMO_KEY); `mnemo user add NAME` prints one"
        )));
    }
    if let Some((address, holder)) = local_server {
        let base = format!("http://{address}");
        let bearer = match (&target.key, &holder.local_token) {
            (Some(key), _) => key.clone(),
            (None, Some(secret)) => local_credential(secret, &user),
            (None, None) => {
                return Err(Failure::usage(format!(
                    "a server holds {} but left no local credential: use --key",
                    settings.data_dir.display()
                )));
            }
        };
        let who = if target.key.is_some() {
            "as the key's user".to_string()
        } else {
            format!("as {user}")
        };
        eprintln!(
            "(talking to the server that holds {}: pid {} at {base}, {who})",
            settings.data_dir.display(),
            holder.pid
        );
        return Ok(Route::Remote { base, bearer });
    }
    if let Some(holder) = held {
        let error = datadir::LockError::Held {
            dir: settings.data_dir.clone(),
            holder,
        };
        return Err(Failure::other(format!(
            "{error}; wait for it to finish or stop it"
        )));
    }
    if target.key.is_some() {
        return Err(Failure::usage(
            "--key is for a server: give --server URL too (no server holds the data directory)",
        ));
    }
    Ok(Route::Embedded { user })
}

/// A base URL from what the user typed: `HOST:PORT` gets `http://`; anything else must be an
/// http(s) URL.
pub fn base_url(text: &str) -> Result<String, Failure> {
    let text = text.trim().trim_end_matches('/');
    let with_scheme = if text.contains("://") {
        text.to_string()
    } else {
        format!("http://{text}")
    };
    let url = url::Url::parse(&with_scheme).map_err(|error| {
        Failure::usage(format!(
            "--server {text:?} is not a server address ({error}): use http://HOST:PORT"
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(Failure::usage(format!(
            "--server {text:?}: use http://HOST:PORT or https://HOST"
        )));
    }
    Ok(with_scheme)
}

/// The address to connect to for a server listening on `address` (an unspecified listen
/// address such as 0.0.0.0 is reached on loopback).
fn reachable(address: &str) -> Option<SocketAddr> {
    let mut addr: SocketAddr = address.parse().ok()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Some(addr)
}

/// Whether the base URL names the server at `address` (same port, a loopback or the same host).
fn same_server(base: &str, address: &SocketAddr) -> bool {
    let Ok(url) = url::Url::parse(base) else {
        return false;
    };
    let port = url.port_or_known_default();
    let host_matches = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip == address.ip() || ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip == address.ip() || ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    };
    host_matches && port == Some(address.port()) && address.ip().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_address_without_a_scheme_is_accepted() {
        assert_eq!(
            base_url("127.0.0.1:41265").ok().as_deref(),
            Some("http://127.0.0.1:41265")
        );
        assert_eq!(
            base_url("https://mnemo.example/").ok().as_deref(),
            Some("https://mnemo.example")
        );
        let bad = base_url("ftp://host").err().map(|failure| failure.message);
        assert!(bad.is_some_and(|message| message.contains("http://HOST:PORT")));
        assert!(base_url("not a server").is_err());
    }

    #[test]
    fn the_local_server_is_recognised_by_port_on_loopback() {
        let address: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert!(same_server("http://127.0.0.1:8080", &address));
        assert!(same_server("http://localhost:8080", &address));
        assert!(!same_server("http://127.0.0.1:8081", &address));
        assert!(!same_server("http://10.0.0.2:8080", &address));
        assert_eq!(
            reachable("0.0.0.0:9000"),
            Some("127.0.0.1:9000".parse().unwrap())
        );
    }
}
