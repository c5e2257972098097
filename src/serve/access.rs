//! Who may ask the server anything: a request must name this server in its Host header (so a
//! page of another site, whose name was rebound to this machine's address, is refused) and
//! carry the token, for reads as for controls. Browsers carry it in a cookie the server sets
//! when a page is opened at the address it printed (`?token=`): HttpOnly, so no script of a
//! page can read it, and SameSite=Strict, so no other site's page can send it. Scripts and
//! tools send it in the `X-Throng-Token` header (or `Authorization: Bearer`).

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use std::net::{IpAddr, SocketAddr};

/// Who may ask, and how to tell.
pub struct Access {
    token: String,
    port: u16,
    bound: IpAddr,
    /// Names besides loopback ones and addresses that requests may give in their Host header
    /// (this machine's, when serving every interface publicly; any the user allowed).
    names: Vec<String>,
    /// The command that started the server, for messages (`throng serve`).
    server: &'static str,
}

/// Why a request is refused: a status and words that say what to do.
pub(crate) struct Refusal(pub StatusCode, pub String);

impl Access {
    pub fn new(token: String, addr: SocketAddr, public: bool, allowed: &[String]) -> Self {
        let mut names: Vec<String> = vec!["localhost".into()];
        if public && addr.ip().is_unspecified() {
            names.push(crate::record::host());
        }
        names.extend(allowed.iter().cloned());
        names.retain(|n| !n.is_empty());
        for n in &mut names {
            n.make_ascii_lowercase();
        }
        Access {
            token,
            port: addr.port(),
            bound: addr.ip(),
            names,
            server: "throng serve",
        }
    }

    /// The same rules for another server, named in the messages (`throng api`).
    pub fn named(mut self, server: &'static str) -> Self {
        self.server = server;
        self
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The cookie that carries the token: one per port, as cookies do not tell ports apart.
    fn cookie_name(&self) -> String {
        format!("throng-token-{}", self.port)
    }

    /// The `Set-Cookie` of a page opened with the token in its address.
    pub fn cookie(&self) -> HeaderValue {
        HeaderValue::from_str(&format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            self.cookie_name(),
            self.token
        ))
        .expect("invariant: the token is hex digits")
    }

    /// Whether `given` is the token.
    pub(crate) fn is_token(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.token.as_bytes())
    }

    /// Refuses a request whose Host header names no address of this server: loopback names
    /// and addresses, the bound address, and the names allowed. An address given as a number
    /// cannot be a rebound name, so with every interface bound any number is fine.
    pub(crate) fn check_host(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let given = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if self.host_ok(given) {
            return Ok(());
        }
        Err(Refusal(
            StatusCode::FORBIDDEN,
            format!(
                "this server does not answer to the host {given:?}: open it at \
                 http://127.0.0.1:{port}/ (the address `{server}` printed){more}",
                port = self.port,
                server = self.server,
                more = if self.bound.is_loopback() {
                    ""
                } else {
                    ", or start it with --allow-host NAME to be reached under another name"
                },
            ),
        ))
    }

    fn host_ok(&self, given: &str) -> bool {
        let (name, port) = split_host(given);
        if port.unwrap_or(80) != self.port {
            return false;
        }
        let name = name.to_ascii_lowercase();
        match name.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bound || self.bound.is_unspecified(),
            Err(_) => self.names.contains(&name),
        }
    }

    /// Refuses a request without the token (401) or with a wrong one (403).
    pub(crate) fn check_token(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        match self.given(headers) {
            Some(t) if self.is_token(&t) => Ok(()),
            Some(_) => Err(Refusal(
                StatusCode::FORBIDDEN,
                format!(
                    "wrong token: open the address `{}` printed, with its ?token=",
                    self.server
                ),
            )),
            None => Err(Refusal(
                StatusCode::UNAUTHORIZED,
                format!(
                    "this server needs its token: open the address `{}` printed (it ends in \
                     ?token=...), or send the token in the header X-Throng-Token",
                    self.server
                ),
            )),
        }
    }

    /// Refuses a control action sent by a page of another origin (another port of this
    /// machine is the same site for cookies, but not the same origin).
    pub(crate) fn check_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
            return Ok(());
        };
        let host = origin
            .strip_prefix("http://")
            .filter(|h| self.host_ok(h) && !h.contains('/'));
        let same = host.is_some_and(|h| {
            headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|given| given.eq_ignore_ascii_case(h))
        });
        if same {
            return Ok(());
        }
        Err(Refusal(
            StatusCode::FORBIDDEN,
            format!("a control action from a page of {origin} is refused: use the run's page"),
        ))
    }

    /// The token a request carries: its header, a bearer token, or the cookie.
    fn given(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(t) = headers.get("x-throng-token").and_then(|v| v.to_str().ok()) {
            return Some(t.to_string());
        }
        if let Some(t) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            return Some(t.to_string());
        }
        let name = self.cookie_name();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    }
}

/// `name:port`, `[v6]:port`, or either without a port.
fn split_host(given: &str) -> (&str, Option<u16>) {
    if let Some(rest) = given.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (given, None),
        };
    }
    match given.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, port.parse().ok().or(Some(0))),
        _ => (given, None),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn hosts_of_this_server_pass_and_others_are_refused() {
        let loopback = Access::new("ab".into(), "127.0.0.1:8787".parse().unwrap(), false, &[]);
        for ok in [
            "127.0.0.1:8787",
            "localhost:8787",
            "LOCALHOST:8787",
            "[::1]:8787",
        ] {
            assert!(loopback.host_ok(ok), "{ok}");
        }
        for bad in [
            "evil.example:8787",
            "127.0.0.1:8788",
            "127.0.0.1",
            "",
            "10.0.0.5:8787",
        ] {
            assert!(!loopback.host_ok(bad), "{bad}");
        }
        let public = Access::new(
            "ab".into(),
            "0.0.0.0:80".parse().unwrap(),
            true,
            &["node1.cluster".into()],
        );
        for ok in ["10.0.0.5", "node1.cluster", "10.0.0.5:80"] {
            assert!(public.host_ok(ok), "{ok}");
        }
        assert!(!public.host_ok("evil.example"));
    }

    #[test]
    fn the_token_comes_in_a_header_or_the_cookie() {
        let a = Access::new("ab".into(), "127.0.0.1:8787".parse().unwrap(), false, &[]);
        assert!(a.check_token(&headers(&[("x-throng-token", "ab")])).is_ok());
        assert!(
            a.check_token(&headers(&[("authorization", "Bearer ab")]))
                .is_ok()
        );
        assert!(
            a.check_token(&headers(&[("cookie", "x=1; throng-token-8787=ab")]))
                .is_ok()
        );
        // Another server's cookie (another port) is not this one's.
        let other = headers(&[("cookie", "throng-token-9999=ab")]);
        assert_eq!(
            a.check_token(&other).unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        let wrong = headers(&[("x-throng-token", "cd")]);
        assert_eq!(a.check_token(&wrong).unwrap_err().0, StatusCode::FORBIDDEN);
        let c = a.cookie();
        let c = c.to_str().unwrap();
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
    }

    #[test]
    fn a_control_from_another_origin_is_refused() {
        let a = Access::new("ab".into(), "127.0.0.1:8787".parse().unwrap(), false, &[]);
        let host = ("host", "127.0.0.1:8787");
        assert!(a.check_origin(&headers(&[host])).is_ok());
        assert!(
            a.check_origin(&headers(&[host, ("origin", "http://127.0.0.1:8787")]))
                .is_ok()
        );
        for origin in ["http://127.0.0.1:9999", "http://evil.example", "null"] {
            assert!(
                a.check_origin(&headers(&[host, ("origin", origin)]))
                    .is_err(),
                "{origin}"
            );
        }
    }
}
