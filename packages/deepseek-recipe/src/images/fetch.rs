//! Fetching image URLs (ureq): size limit, timeouts, no proxy, and an optional destination filter
//! checked for the URL's host and every redirect target.

use std::io::Read;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::Duration;

use super::error::{ImageError, ImageErrorKind};

pub const DEFAULT_MAX_BYTES: u64 = 20 * 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(30);
const MAX_REDIRECTS: usize = 5;

/// Decides whether the fetcher may connect to `address` (an IP) resolved for `host`.
pub type DestinationFilter = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

#[derive(Clone)]
pub struct ImageFetcher {
    pub max_bytes: u64,
    pub destination_filter: Option<DestinationFilter>,
}

impl Default for ImageFetcher {
    fn default() -> Self {
        Self { max_bytes: DEFAULT_MAX_BYTES, destination_filter: None }
    }
}

impl ImageFetcher {
    /// Whether the filter allows some address of the URL's host (`Ok(false)`: rejected; `Err`: the
    /// host could not be resolved).
    fn destination_allowed(&self, url: &str) -> Result<bool, ()> {
        let Some(filter) = &self.destination_filter else { return Ok(true) };
        let parsed: ureq::http::Uri = url.parse().map_err(|_| ())?;
        let host = parsed.host().ok_or(())?;
        let port = parsed.port_u16().unwrap_or(if parsed.scheme_str() == Some("http") { 80 } else { 443 });
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addresses = (host, port).to_socket_addrs().map_err(|_| ())?;
        Ok(addresses.into_iter().any(|a| filter(host, &a.ip().to_string())))
    }

    /// Downloads `url`, following redirects itself so every hop passes the destination filter.
    pub fn fetch(&self, url: &str) -> Result<Vec<u8>, ImageError> {
        let fail = |kind| ImageError::new(kind, url);
        self.download(url).map_err(fail)
    }

    fn download(&self, url: &str) -> Result<Vec<u8>, ImageErrorKind> {
        use ImageErrorKind::{DestinationRejected, Fetch, TooLarge};
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .max_redirects(0)
            .proxy(None)
            .http_status_as_error(false)
            .build()
            .into();
        let mut current = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            match self.destination_allowed(&current) {
                Ok(true) => {}
                Ok(false) => return Err(DestinationRejected),
                Err(()) => return Err(Fetch),
            }
            let mut response = agent.get(&current).call().map_err(|_| Fetch)?;
            let status = response.status();
            if status.is_redirection() {
                let location =
                    response.headers().get("location").and_then(|v| v.to_str().ok()).ok_or(Fetch)?;
                current = resolve_location(&current, location);
                continue;
            }
            if !status.is_success() {
                return Err(Fetch);
            }
            let mut body = Vec::new();
            response
                .body_mut()
                .as_reader()
                .take(self.max_bytes + 1)
                .read_to_end(&mut body)
                .map_err(|_| Fetch)?;
            if body.len() as u64 > self.max_bytes {
                return Err(TooLarge);
            }
            return Ok(body);
        }
        Err(Fetch)
    }
}

/// An absolute redirect target from a `Location` header.
fn resolve_location(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_owned();
    }
    let origin_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[origin_end..].find('/').map_or(base.len(), |i| origin_end + i);
    if location.starts_with('/') {
        format!("{}{location}", &base[..host_end])
    } else {
        let dir_end = base.rfind('/').filter(|&i| i >= host_end).unwrap_or(host_end);
        format!("{}/{location}", &base[..dir_end])
    }
}

#[cfg(test)]
mod tests {
    use super::resolve_location;

    #[test]
    fn redirect_targets() {
        assert_eq!(resolve_location("https://a.b/x/y.png", "/z.png"), "https://a.b/z.png");
        assert_eq!(resolve_location("https://a.b/x/y.png", "z.png"), "https://a.b/x/z.png");
        assert_eq!(resolve_location("https://a.b/x", "https://c.d/e"), "https://c.d/e");
    }
}
