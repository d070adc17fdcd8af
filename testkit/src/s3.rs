//! The S3 client and SigV4 settings the tests and the bench start from.

use aws_credential_types::Credentials;
use aws_sdk_s3::config::{BehaviorVersion, Region};
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SigningSettings, UriPathNormalizationMode,
};
use aws_smithy_runtime_api::client::identity::Identity;

/// An S3 client configuration for `endpoint` signed with `key`, in
/// `us-east-1`, path style and without retries, so that the caller sees
/// every answer. `who` names the credentials' provider.
pub fn client_config(
    endpoint: &str,
    key: (&str, &str),
    who: &'static str,
) -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key.0, key.1, None, None, who))
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
}

/// SigV4 settings as an S3 SDK signs: the path encoded once and not
/// normalised, the payload hash sent in `x-amz-content-sha256`.
pub fn signing_settings() -> SigningSettings {
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings
}

/// The identity of the access key `key` (id, secret), for signing.
pub fn identity(key: (&str, &str)) -> Identity {
    Credentials::new(key.0, key.1, None, None, "testkit").into()
}

/// The part list of an upload of parts `1..=n` with these ETags, in order:
/// what `CompleteMultipartUpload` sends.
pub fn completed_parts<'a>(
    e_tags: impl IntoIterator<Item = Option<&'a str>>,
) -> aws_sdk_s3::types::CompletedMultipartUpload {
    let mut list = aws_sdk_s3::types::CompletedMultipartUpload::builder();
    for (n, e_tag) in (1..).zip(e_tags) {
        list = list.parts(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(n)
                .set_e_tag(e_tag.map(str::to_owned))
                .build(),
        );
    }
    list.build()
}
