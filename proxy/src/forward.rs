//! Forwarding S3 operations to another `S3` implementation.

/// Implements S3 trait methods by forwarding each request to what the
/// inherent method `self.$target()` returns, passing the result through
/// `$map`.
/// Written out in the shape `async_trait` gives trait methods, because the
/// attribute cannot see into a macro invocation.
#[macro_export]
macro_rules! forward_s3 {
    // `check = path;`: each request's input passes `path` first (the dev
    // store's own key check, `object_key::require_all`).
    ($target:ident => $map:path; check = $check:path; $($rest:tt)*) => {
        $crate::forward_s3!(@each $target, $map, $check; $($rest)*);
    };
    ($target:ident => $map:path; $($rest:tt)*) => {
        $crate::forward_s3!(@each $target, $map, $crate::object_key::unchecked; $($rest)*);
    };
    (@each $target:ident, $map:path, $check:path; $($name:ident: $input:ty => $output:ty;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                req: s3s::S3Request<$input>,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = s3s::S3Result<s3s::S3Response<$output>>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    $check(&req.input)?;
                    $map(self.$target().$name(req).await)
                })
            }
        )*
    };
}
