//! Per-call storage options by the names users already know: the one table from
//! fsspec/s3fs/gcsfs/adlfs and `object_store` option names to [`StorageOptions`].
//!
//! Python passes `storage_options={...}` (nested dictionaries such as s3fs' `client_kwargs`
//! arrive flattened with dots: `client_kwargs.endpoint_url`); the CLI and Rust callers may use
//! the same names. Which names apply depends on the location's backend (`token` is a session
//! token for S3 but a credentials file for GCS), so options are resolved against a URL.
//! Besides the names in the tables below, every configuration key `object_store` knows for
//! that backend is accepted as is (`aws_virtual_hosted_style_request`, `google_base_url`,
//! `azure_use_azure_cli`, client keys such as `timeout` or `proxy_url`...). Anything else is
//! refused with the list of accepted names. Values are never logged or quoted.
//!
//! ```
//! use shardstream_storage::{named_options, StorageOptions};
//!
//! let pairs = [("endpoint_url", "http://127.0.0.1:9000"), ("key", "AKIA"), ("secret", "s")];
//! let o = named_options::apply("s3://bucket/ds", &pairs, StorageOptions::default()).unwrap();
//! assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
//! assert!(named_options::apply("s3://b", &[("bogus", "1")], StorageOptions::default()).is_err());
//! ```

use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;

use crate::error::{Result, StorageError};
use crate::options::StorageOptions;
use crate::url::StorageUrl;

/// Option pairs as given (`("key", "AKIA...")`), held until a location is opened with them.
/// Its `Debug` shows the names and masks every value, so that a configuration holding it can
/// be logged.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NamedOptions(pub Vec<(String, String)>);

impl std::fmt::Debug for NamedOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, _)| (k, crate::redact::MASK)))
            .finish()
    }
}

impl std::ops::Deref for NamedOptions {
    type Target = [(String, String)];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl From<Vec<(String, String)>> for NamedOptions {
    fn from(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }
}

/// What an option name sets.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Endpoint,
    Region,
    AllowHttp,
    Anonymous,
    Profile,
    /// `client_kwargs.verify=False`: accept any TLS certificate.
    Verify,
    /// gcsfs' `token`: `anon`, `google_default`/`cloud`, or a service-account file.
    GcsToken,
    /// Accepted for compatibility, not needed (gcsfs' `project`).
    Ignored,
    /// An `object_store` configuration key of the backend.
    Config(&'static str),
    /// An `object_store` key given by one of its own names (canonical form).
    Key(String),
}

use Target::*;

/// S3 names: s3fs (`key`, `secret`, `token`, `anon`, `endpoint_url`, `client_kwargs`),
/// boto3 (`aws_access_key_id`, `region_name`, `profile_name`) and `object_store`.
const S3: &[(&str, Target)] = &[
    ("endpoint_url", Endpoint),
    ("endpoint", Endpoint),
    ("aws_endpoint", Endpoint),
    ("aws_endpoint_url", Endpoint),
    ("client_kwargs.endpoint_url", Endpoint),
    ("region", Region),
    ("region_name", Region),
    ("aws_region", Region),
    ("client_kwargs.region_name", Region),
    ("allow_http", AllowHttp),
    ("aws_allow_http", AllowHttp),
    ("anon", Anonymous),
    ("skip_signature", Anonymous),
    ("aws_skip_signature", Anonymous),
    ("profile", Profile),
    ("profile_name", Profile),
    ("aws_profile", Profile),
    ("key", Config("aws_access_key_id")),
    ("access_key_id", Config("aws_access_key_id")),
    ("aws_access_key_id", Config("aws_access_key_id")),
    (
        "client_kwargs.aws_access_key_id",
        Config("aws_access_key_id"),
    ),
    ("secret", Config("aws_secret_access_key")),
    ("secret_access_key", Config("aws_secret_access_key")),
    ("aws_secret_access_key", Config("aws_secret_access_key")),
    (
        "client_kwargs.aws_secret_access_key",
        Config("aws_secret_access_key"),
    ),
    ("token", Config("aws_session_token")),
    ("session_token", Config("aws_session_token")),
    ("aws_session_token", Config("aws_session_token")),
    (
        "client_kwargs.aws_session_token",
        Config("aws_session_token"),
    ),
    ("client_kwargs.verify", Verify),
];

/// GCS names: gcsfs (`token`, `anon`, `endpoint_url`, `project`) and `object_store`.
const GCS: &[(&str, Target)] = &[
    ("endpoint_url", Config("google_base_url")),
    ("endpoint", Config("google_base_url")),
    ("allow_http", AllowHttp),
    ("anon", Anonymous),
    ("skip_signature", Anonymous),
    ("google_skip_signature", Anonymous),
    ("token", GcsToken),
    ("service_account_file", Config("google_service_account")),
    ("project", Ignored),
];

/// Azure names: adlfs (`account_name`, `account_key`, `sas_token`, `anon`, `client_id`...)
/// and `object_store`.
const AZURE: &[(&str, Target)] = &[
    ("endpoint_url", Config("azure_storage_endpoint")),
    ("allow_http", AllowHttp),
    ("anon", Config("azure_skip_signature")),
];

/// `options` with `pairs` applied for the location `url`.
pub fn apply<K: AsRef<str>, V: AsRef<str>>(
    url: &str,
    pairs: &[(K, V)],
    options: StorageOptions,
) -> Result<StorageOptions> {
    let parsed = StorageUrl::parse(url)?;
    apply_parsed(&parsed, pairs, options)
}

/// [`apply`] for an already parsed URL.
pub fn apply_parsed<K: AsRef<str>, V: AsRef<str>>(
    url: &StorageUrl,
    pairs: &[(K, V)],
    mut options: StorageOptions,
) -> Result<StorageOptions> {
    for (key, value) in pairs {
        let (key, value) = (key.as_ref().trim(), value.as_ref());
        let target = target(url, key).ok_or_else(|| StorageError::Config {
            url: url.to_string(),
            reason: format!(
                "unknown storage option {key:?} for {} locations; accepted: {}",
                scheme(url),
                accepted(url)
            ),
        })?;
        if is_secret(&target) {
            crate::redact::register_secret(value);
        }
        let flag = || parse_bool(url, key, value);
        match target {
            Endpoint => options.endpoint = Some(value.to_string()),
            Region => options.region = Some(value.to_string()),
            AllowHttp => options.allow_http = Some(flag()?),
            Anonymous => options.anonymous = Some(flag()?),
            Profile => options.profile = Some(value.to_string()),
            Verify => {
                let insecure = !flag()?;
                options
                    .config
                    .push(("allow_invalid_certificates".into(), insecure.to_string()));
            }
            GcsToken => match value {
                "anon" => options.anonymous = Some(true),
                "google_default" | "cloud" | "" => {}
                path => options
                    .config
                    .push(("google_service_account".into(), path.to_string())),
            },
            Ignored => {}
            Config(name) => options.config.push((name.to_string(), value.to_string())),
            Key(name) => options.config.push((name, value.to_string())),
        }
    }
    Ok(options)
}

fn target(url: &StorageUrl, key: &str) -> Option<Target> {
    let lower = key.to_ascii_lowercase();
    let table = match url {
        StorageUrl::S3 { .. } => S3,
        StorageUrl::Gcs { .. } => GCS,
        StorageUrl::Azure { .. } => AZURE,
        // Options are meaningless for a local path; names valid for S3 are let through so
        // that one `storage_options` can serve datasets that mix local and remote streams.
        StorageUrl::Local { .. } => {
            return target_s3(&lower).map(|_| Ignored);
        }
    };
    if let Some((_, t)) = table.iter().find(|(name, _)| *name == lower) {
        return Some(t.clone());
    }
    match url {
        StorageUrl::S3 { .. } => target_s3(&lower),
        StorageUrl::Gcs { .. } => lower.parse::<GoogleConfigKey>().ok().map(|k| match k {
            GoogleConfigKey::SkipSignature => Anonymous,
            GoogleConfigKey::Client(object_store::ClientConfigKey::AllowHttp) => AllowHttp,
            other => Key(other.as_ref().to_string()),
        }),
        StorageUrl::Azure { .. } => lower.parse::<AzureConfigKey>().ok().map(|k| match k {
            AzureConfigKey::Client(object_store::ClientConfigKey::AllowHttp) => AllowHttp,
            other => Key(other.as_ref().to_string()),
        }),
        StorageUrl::Local { .. } => None,
    }
}

fn target_s3(lower: &str) -> Option<Target> {
    if let Some((_, t)) = S3.iter().find(|(name, _)| *name == lower) {
        return Some(t.clone());
    }
    let key = lower.parse::<AmazonS3ConfigKey>().ok()?;
    Some(match key {
        AmazonS3ConfigKey::Endpoint => Endpoint,
        AmazonS3ConfigKey::Region | AmazonS3ConfigKey::DefaultRegion => Region,
        AmazonS3ConfigKey::SkipSignature => Anonymous,
        AmazonS3ConfigKey::Client(object_store::ClientConfigKey::AllowHttp) => AllowHttp,
        other => Key(other.as_ref().to_string()),
    })
}

fn is_secret(target: &Target) -> bool {
    match target {
        Config(name) => crate::redact::is_sensitive_name(name),
        Key(name) => crate::redact::is_sensitive_name(name),
        _ => false,
    }
}

fn parse_bool(url: &StorageUrl, key: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(StorageError::Config {
            url: url.to_string(),
            reason: format!("storage option {key:?} takes true or false"),
        }),
    }
}

fn scheme(url: &StorageUrl) -> &'static str {
    match url {
        StorageUrl::S3 { .. } => "s3://",
        StorageUrl::Gcs { .. } => "gs://",
        StorageUrl::Azure { .. } => "az://",
        StorageUrl::Local { .. } => "local",
    }
}

fn accepted(url: &StorageUrl) -> String {
    let (table, family) = match url {
        StorageUrl::S3 { .. } | StorageUrl::Local { .. } => (S3, "AmazonS3ConfigKey (aws_*)"),
        StorageUrl::Gcs { .. } => (GCS, "GoogleConfigKey (google_*)"),
        StorageUrl::Azure { .. } => (
            AZURE,
            "AzureConfigKey (azure_*, account_name, sas_token...)",
        ),
    };
    let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
    format!(
        "{}, any object_store {family} name, or an HTTP client key (timeout, connect_timeout, \
         proxy_url...)",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(pairs: &[(&str, &str)]) -> Result<StorageOptions> {
        apply("s3://b/p", pairs, StorageOptions::default())
    }

    #[test]
    fn fsspec_boto_and_object_store_names_map_to_the_same_settings() {
        for (endpoint, region, key) in [
            ("endpoint_url", "region", "key"),
            (
                "client_kwargs.endpoint_url",
                "client_kwargs.region_name",
                "aws_access_key_id",
            ),
            ("aws_endpoint", "aws_region", "access_key_id"),
        ] {
            let o = s3(&[
                (endpoint, "http://127.0.0.1:9"),
                (region, "eu-west-3"),
                (key, "AK"),
            ])
            .unwrap();
            assert_eq!(
                o.endpoint.as_deref(),
                Some("http://127.0.0.1:9"),
                "{endpoint}"
            );
            assert_eq!(o.region.as_deref(), Some("eu-west-3"), "{region}");
            assert_eq!(o.config, vec![("aws_access_key_id".into(), "AK".into())]);
        }
    }

    #[test]
    fn flags_and_object_store_keys() {
        let o = s3(&[
            ("anon", "true"),
            ("profile", "prod"),
            ("client_kwargs.verify", "false"),
            ("aws_virtual_hosted_style_request", "true"),
            ("timeout", "30s"),
        ])
        .unwrap();
        assert_eq!(o.anonymous, Some(true));
        assert_eq!(o.profile.as_deref(), Some("prod"));
        let keys: Vec<&str> = o.config.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "allow_invalid_certificates",
                "aws_virtual_hosted_style_request",
                "timeout"
            ]
        );
        assert!(s3(&[("anon", "maybe")]).is_err());
    }

    #[test]
    fn unknown_names_are_refused_with_the_accepted_list() {
        let err = s3(&[("endpoint_uri", "x")]).unwrap_err().to_string();
        assert!(
            err.contains("\"endpoint_uri\"") && err.contains("endpoint_url"),
            "{err}"
        );
        // `region` is an S3 name, not a GCS one.
        let err = apply("gs://b", &[("region", "x")], StorageOptions::default()).unwrap_err();
        assert!(err.to_string().contains("gs://"), "{err}");
    }

    #[test]
    fn token_means_what_each_backend_means_by_it() {
        let o = s3(&[("token", "session")]).unwrap();
        assert_eq!(o.config[0].0, "aws_session_token");
        let g = |v| apply("gs://b", &[("token", v)], StorageOptions::default()).unwrap();
        assert_eq!(g("anon").anonymous, Some(true));
        assert_eq!(g("/sa.json").config[0].0, "google_service_account");
        let a = apply(
            "az://c/p",
            &[
                ("account_name", "acct"),
                ("sas_token", "sv=1"),
                ("anon", "false"),
            ],
            StorageOptions::default(),
        )
        .unwrap();
        let keys: Vec<&str> = a.config.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "azure_storage_account_name",
                "azure_storage_sas_key",
                "azure_skip_signature"
            ]
        );
    }

    #[test]
    fn secrets_are_not_in_errors_or_debug() {
        let o = s3(&[("secret", "hunter2-secret"), ("key", "AK")]).unwrap();
        assert!(!format!("{o:?}").contains("hunter2-secret"));
        let err = s3(&[("secret", "hunter2-secret"), ("nope", "hunter2-secret")]).unwrap_err();
        assert!(!err.to_string().contains("hunter2-secret"), "{err}");
    }

    #[test]
    fn held_options_debug_without_values() {
        let held = NamedOptions::from(vec![("secret".to_string(), "hunter2-secret".to_string())]);
        let text = format!("{held:?}");
        assert!(
            text.contains("secret") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn local_paths_accept_and_ignore_s3_names() {
        let o = apply(
            "/data/ds",
            &[("key", "AK"), ("anon", "true")],
            StorageOptions::default(),
        )
        .unwrap();
        assert!(o.config.is_empty() && o.anonymous.is_none());
        assert!(apply("/data/ds", &[("bogus", "1")], StorageOptions::default()).is_err());
    }
}
