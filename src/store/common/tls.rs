//! TLS for PostgreSQL and MySQL/MariaDB connections: the mode ([`TlsMode`], libpq's
//! `sslmode` names), where it is read from (the URL's `sslmode` / `sslrootcert`, or
//! [`StoreOptions`](crate::StoreOptions)), and the rustls configuration each mode needs.
//!
//! The store speaks TLS with rustls (pure Rust, no system OpenSSL to match at build or run
//! time; the `ring` provider, which needs no C toolchain beyond `cc`). One configuration
//! serves every connection a store opens: the pools, the lease-renewal lane, the LISTEN
//! connection and PostgreSQL's `COPY` connection.
//!
//! The modes mean what they mean to `psql`, so a URL that works there works here:
//!
//! | mode          | encrypted                 | server certificate checked            |
//! |---------------|---------------------------|---------------------------------------|
//! | `disable`     | no                        | —                                     |
//! | `prefer`      | if the server offers TLS  | no                                    |
//! | `require`     | yes, or the connect fails | no (as `verify-ca` if a root is given)|
//! | `verify-ca`   | yes                       | signed by a trusted root              |
//! | `verify-full` | yes                       | trusted root **and** the host's name  |
//!
//! Trusted roots: the PEM file given as `sslrootcert` (or
//! [`StoreOptions::tls_root_cert`](crate::StoreOptions::tls_root_cert)); without one, the
//! Mozilla roots compiled in (`webpki-roots`), which cover managed databases whose
//! certificates chain to a public authority.

use std::str::FromStr;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use network::split_url;
#[cfg(feature = "mysql")]
pub(crate) use network::{root_certs, TlsSettings};

/// Whether and how a connection to PostgreSQL or MySQL/MariaDB uses TLS. The names are
/// libpq's `sslmode` values; MySQL's `ssl-mode` names are accepted too. SQLite ignores it.
///
/// The default is [`TlsMode::Prefer`], as for `psql` and the MySQL client: encrypted when
/// the server offers it, with no check of who the server is. Use
/// [`TlsMode::VerifyFull`] against a database reached over a network you do not control.
///
/// # Examples
/// ```
/// use jobvisor::TlsMode;
/// assert_eq!("verify-full".parse::<TlsMode>().unwrap(), TlsMode::VerifyFull);
/// assert_eq!("REQUIRED".parse::<TlsMode>().unwrap(), TlsMode::Require); // MySQL's name
/// assert!("yes".parse::<TlsMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TlsMode {
    /// Never TLS (`disable`; MySQL `DISABLED`).
    Disable,
    /// TLS when the server offers it, unverified; plain otherwise (`prefer`; MySQL
    /// `PREFERRED`). The default.
    #[default]
    Prefer,
    /// TLS or no connection; the certificate is not checked unless a root certificate is
    /// given, in which case it is checked as for [`TlsMode::VerifyCa`] (`require`; MySQL
    /// `REQUIRED`).
    Require,
    /// TLS, and the certificate must chain to a trusted root (`verify-ca`; MySQL
    /// `VERIFY_CA`). On MySQL/MariaDB the driver (mysql_async 0.36 with rustls 0.23) also
    /// refuses a certificate that names another host, as [`TlsMode::VerifyFull`] does:
    /// stricter than asked, never looser; dial the server by a name its certificate carries.
    VerifyCa,
    /// TLS, a trusted chain, and the certificate must name the host connected to
    /// (`verify-full`; MySQL `VERIFY_IDENTITY`).
    VerifyFull,
}

impl TlsMode {
    /// The libpq name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disable => "disable",
            TlsMode::Prefer => "prefer",
            TlsMode::Require => "require",
            TlsMode::VerifyCa => "verify-ca",
            TlsMode::VerifyFull => "verify-full",
        }
    }
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TlsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "disable" | "disabled" => Ok(TlsMode::Disable),
            "prefer" | "preferred" => Ok(TlsMode::Prefer),
            "require" | "required" => Ok(TlsMode::Require),
            "verify-ca" => Ok(TlsMode::VerifyCa),
            "verify-full" | "verify-identity" => Ok(TlsMode::VerifyFull),
            _ => Err(format!(
                "unknown TLS mode {s:?}; expected disable, prefer, require, verify-ca or \
                 verify-full (MySQL's DISABLED, PREFERRED, REQUIRED, VERIFY_CA, \
                 VERIFY_IDENTITY also work)"
            )),
        }
    }
}

/// The mode as the network backends use it: where it is read from, and rustls.
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod network {
    use std::path::{Path, PathBuf};
    #[cfg(feature = "postgres")]
    use std::sync::Arc;

    #[cfg(feature = "postgres")]
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    #[cfg(feature = "postgres")]
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::CertificateDer;
    #[cfg(feature = "postgres")]
    use rustls::pki_types::{ServerName, UnixTime};
    #[cfg(feature = "postgres")]
    use rustls::{
        CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    };

    use super::TlsMode;

    /// The TLS settings a store connects with: the mode and the trusted root, if any.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub(crate) struct TlsSettings {
        pub(crate) mode: TlsMode,
        pub(crate) root_cert: Option<PathBuf>,
    }

    /// URL parameters naming the TLS mode (libpq's, then MySQL's spellings).
    const MODE_KEYS: [&str; 3] = ["sslmode", "ssl-mode", "ssl_mode"];
    /// URL parameters naming the root certificate file.
    const ROOT_KEYS: [&str; 3] = ["sslrootcert", "ssl-ca", "ssl_ca"];
    /// mysql_async's own TLS switches: refused, so that there is one way to say it.
    const DRIVER_KEYS: [&str; 4] = [
        "require_ssl",
        "verify_ca",
        "verify_identity",
        "built_in_roots",
    ];

    /// Takes the TLS parameters out of a `postgres://` or `mysql://` URL: answers the URL
    /// without them (for the driver, which would refuse `verify-full` or a root-file
    /// parameter) and the settings they make, with the options' own settings taking precedence
    /// over the URL's. A URL that is not `scheme://…` (a libpq key=value string) is passed on
    /// unchanged.
    ///
    /// # Errors
    /// A message naming the parameter and what was expected.
    pub(crate) fn split_url(
        url: &str,
        mode: Option<TlsMode>,
        root_cert: Option<&Path>,
    ) -> Result<(String, TlsSettings), String> {
        let mut settings = TlsSettings::default();
        let Ok(mut parsed) = url::Url::parse(url) else {
            settings.mode = mode.unwrap_or_default();
            settings.root_cert = root_cert.map(Path::to_path_buf);
            return Ok((url.to_string(), settings));
        };
        // Kept parameters keep their text as written: re-encoding them would turn `%20` into
        // `+`, which the drivers read literally (`options=-c%20search_path%3Dx`).
        let mut kept: Vec<String> = Vec::new();
        let mut found = false;
        let query = parsed.query().unwrap_or("").to_string();
        for raw in query.split('&').filter(|s| !s.is_empty()) {
            let Some((k, v)) = url::form_urlencoded::parse(raw.as_bytes()).next() else {
                continue;
            };
            let key = k.as_ref();
            if MODE_KEYS.contains(&key) {
                settings.mode = v.parse()?;
                found = true;
            } else if ROOT_KEYS.contains(&key) {
                if v.is_empty() {
                    return Err(format!("{key} is empty; expected the path of a PEM file"));
                }
                settings.root_cert = Some(PathBuf::from(v.as_ref()));
                found = true;
            } else if DRIVER_KEYS.contains(&key) {
                return Err(format!(
                    "URL parameter {key} is not supported; expected sslmode=disable|prefer|\
                     require|verify-ca|verify-full and sslrootcert=<PEM file>"
                ));
            } else {
                kept.push(raw.to_string());
            }
        }
        if found {
            if kept.is_empty() {
                parsed.set_query(None);
            } else {
                parsed.set_query(Some(&kept.join("&")));
            }
        }
        if let Some(m) = mode {
            settings.mode = m;
        }
        if let Some(p) = root_cert {
            settings.root_cert = Some(p.to_path_buf());
        }
        let out = if found {
            parsed.to_string()
        } else {
            url.to_string()
        };
        Ok((out, settings))
    }

    impl TlsSettings {
        /// Whether the server's certificate is checked against trusted roots.
        pub(crate) fn verifies_chain(&self) -> bool {
            match self.mode {
                TlsMode::Disable | TlsMode::Prefer => false,
                TlsMode::Require => self.root_cert.is_some(),
                TlsMode::VerifyCa | TlsMode::VerifyFull => true,
            }
        }

        /// Whether the certificate must also name the host.
        pub(crate) fn verifies_host(&self) -> bool {
            self.mode == TlsMode::VerifyFull
        }

        #[cfg(feature = "postgres")]
        /// The rustls configuration for this mode (never used for `disable`).
        ///
        /// # Errors
        /// A message naming the root file and why it could not be used.
        pub(crate) fn client_config(&self) -> Result<ClientConfig, String> {
            // rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange, which
            // needs aws-lc-rs and a C toolchain with cmake); ring stays jobvisor's provider,
            // and the warning would otherwise show in every build of an application that
            // takes jobvisor by path or from a fresh resolve.
            #[allow(deprecated)]
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let builder = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS set-up: {e}"))?;
            if !self.verifies_chain() {
                return Ok(builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
                    .with_no_client_auth());
            }
            let roots = Arc::new(self.roots()?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| format!("TLS set-up: {e}"))?;
            let verifier: Arc<dyn ServerCertVerifier> = if self.verifies_host() {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            };
            Ok(builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth())
        }

        #[cfg(feature = "postgres")]
        /// The trusted roots: the given PEM file's certificates, else the compiled-in Mozilla set.
        fn roots(&self) -> Result<RootCertStore, String> {
            let mut roots = RootCertStore::empty();
            let Some(path) = &self.root_cert else {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                return Ok(roots);
            };
            for cert in root_certs(path)? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "sslrootcert {}: a certificate cannot be used as a root: {e}",
                        path.display()
                    )
                })?;
            }
            Ok(roots)
        }
    }

    /// The certificates of a PEM file.
    ///
    /// # Errors
    /// A message naming the file: unreadable, not PEM, or holding no certificate.
    pub(crate) fn root_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("sslrootcert {}: cannot be read: {e}", path.display()))?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("sslrootcert {}: not a PEM file: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "sslrootcert {}: holds no certificate; expected PEM (-----BEGIN CERTIFICATE-----)",
                path.display()
            ));
        }
        Ok(certs)
    }

    #[cfg(feature = "postgres")]
    /// `prefer` and `require` without a root: the channel is encrypted and the handshake's
    /// signatures are checked, but not who signed the certificate (libpq's behaviour).
    #[derive(Debug)]
    struct Unverified(Arc<rustls::crypto::CryptoProvider>);

    #[cfg(feature = "postgres")]
    impl ServerCertVerifier for Unverified {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    #[cfg(feature = "postgres")]
    /// `verify-ca`: the full chain check, except that the certificate need not name the host.
    #[derive(Debug)]
    struct AnyName(Arc<WebPkiServerVerifier>);

    #[cfg(feature = "postgres")]
    impl ServerCertVerifier for AnyName {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            match self.0.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "postgres")]
    use network::root_certs;
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    use network::TlsSettings;
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    use std::path::Path;
    #[cfg(feature = "postgres")]
    use std::path::PathBuf;

    #[test]
    fn modes_parse_by_libpq_and_mysql_names() {
        for (s, m) in [
            ("disable", TlsMode::Disable),
            ("DISABLED", TlsMode::Disable),
            ("prefer", TlsMode::Prefer),
            ("preferred", TlsMode::Prefer),
            ("require", TlsMode::Require),
            ("REQUIRED", TlsMode::Require),
            ("verify-ca", TlsMode::VerifyCa),
            ("VERIFY_CA", TlsMode::VerifyCa),
            ("verify-full", TlsMode::VerifyFull),
            ("VERIFY_IDENTITY", TlsMode::VerifyFull),
        ] {
            assert_eq!(s.parse::<TlsMode>(), Ok(m), "{s}");
        }
        let err = "allow".parse::<TlsMode>().unwrap_err();
        assert!(
            err.contains("\"allow\"") && err.contains("verify-full"),
            "{err}"
        );
        assert_eq!(TlsMode::default(), TlsMode::Prefer);
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn tls_parameters_are_taken_out_of_the_url() {
        let (url, s) = split_url(
            "postgres://u:p%40ss@db.example:5432/app?sslmode=verify-full&application_name=x&sslrootcert=/etc/ca.pem",
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:p%40ss@db.example:5432/app?application_name=x"
        );
        assert_eq!(s.mode, TlsMode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));

        let (url, s) = split_url("mysql://root@h/db?ssl-mode=REQUIRED", None, None).unwrap();
        assert_eq!(url, "mysql://root@h/db");
        assert_eq!(s.mode, TlsMode::Require);

        // What stays keeps its encoding (a re-encoded `%20` would become a literal `+`).
        let (url, s) = split_url(
            "postgres://u@h/db?sslmode=disable&options=-c%20search_path%3Djv_1",
            None,
            None,
        )
        .unwrap();
        assert_eq!(url, "postgres://u@h/db?options=-c%20search_path%3Djv_1");
        assert_eq!(s.mode, TlsMode::Disable);

        // Nothing to take: the URL is passed on byte for byte.
        let plain = "postgres://u@h/db?connect_timeout=3";
        assert_eq!(split_url(plain, None, None).unwrap().0, plain);
        assert_eq!(
            split_url(plain, None, None).unwrap().1,
            TlsSettings::default()
        );

        // The options win over the URL.
        let (_, s) = split_url(
            "postgres://u@h/db?sslmode=disable",
            Some(TlsMode::VerifyCa),
            Some(Path::new("/ca.pem")),
        )
        .unwrap();
        assert_eq!(s.mode, TlsMode::VerifyCa);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/ca.pem")));
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    #[test]
    fn bad_tls_parameters_are_refused_by_name() {
        let e = split_url("postgres://u@h/db?sslmode=allow", None, None).unwrap_err();
        assert!(e.contains("\"allow\""), "{e}");
        let e = split_url("mysql://u@h/db?require_ssl=true", None, None).unwrap_err();
        assert!(e.contains("require_ssl") && e.contains("sslmode="), "{e}");
        let e = split_url("postgres://u@h/db?sslrootcert=", None, None).unwrap_err();
        assert!(e.contains("sslrootcert") && e.contains("PEM"), "{e}");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn root_files_that_cannot_serve_are_named() {
        let dir = std::env::temp_dir().join(format!("jobvisor-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = root_certs(&missing).unwrap_err();
        assert!(
            e.contains("missing.pem") && e.contains("cannot be read"),
            "{e}"
        );
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = root_certs(&empty).unwrap_err();
        assert!(
            e.contains("empty.pem") && e.contains("no certificate"),
            "{e}"
        );
        let settings = TlsSettings {
            mode: TlsMode::VerifyFull,
            root_cert: Some(empty),
        };
        assert!(settings.client_config().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn each_mode_builds_a_configuration() {
        for mode in [
            TlsMode::Prefer,
            TlsMode::Require,
            TlsMode::VerifyCa,
            TlsMode::VerifyFull,
        ] {
            let s = TlsSettings {
                mode,
                root_cert: None,
            };
            assert!(s.client_config().is_ok(), "{mode}");
        }
        let req = TlsSettings {
            mode: TlsMode::Require,
            root_cert: Some(PathBuf::from("/ca.pem")),
        };
        assert!(req.verifies_chain() && !req.verifies_host());
    }
}
