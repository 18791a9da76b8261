//! `--listen ADDR`, the address the metrics and profiles are served on.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Parses `--listen`: `PORT` (127.0.0.1), `IP:PORT`, `[IPv6]:PORT` or
/// `localhost:PORT`. A non-loopback address must be written out.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("'{text}': the port must be 0..=65535"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if text.starts_with(':') {
        return Err(format!(
            "'{text}' has no address: write 127.0.0.1{text}, or 0.0.0.0{text} to be \
             reachable from other hosts"
        ));
    }
    text.parse::<SocketAddr>().map_err(|_| {
        format!("'{text}' is not PORT, IP:PORT or [IPv6]:PORT (e.g. 9464 or 0.0.0.0:9464)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_alone_is_loopback_and_other_addresses_are_explicit() {
        assert_eq!(parse_listen("9464"), Ok("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(
            parse_listen("localhost:9464"),
            Ok("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(
            parse_listen("0.0.0.0:9464"),
            Ok("0.0.0.0:9464".parse().unwrap())
        );
        assert_eq!(parse_listen("[::1]:80"), Ok("[::1]:80".parse().unwrap()));
        for bad in [":9464", "70000", "host:9464", "1.2.3:80", "", "9464x"] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
    }
}
