//! Forwarding S3 operations to another `S3` implementation.

/// Implements S3 trait methods by forwarding each request to what the
/// inherent method `self.$target()` returns, passing the result through
/// `$map`.
/// Written out in the shape `async_trait` gives trait methods, because the
/// attribute cannot see into a macro invocation.
#[macro_export]
macro_rules! forward_s3 {
    // `check_key;`: the request's object key must pass
    // `object_key::require` first (the dev store's own check).
    ($target:ident => $map:path; check_key; $($name:ident: $input:ty => $output:ty;)*) => {
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
                    $crate::object_key::require(&req.input.key)?;
                    $map(self.$target().$name(req).await)
                })
            }
        )*
    };
    ($target:ident => $map:path; $($name:ident: $input:ty => $output:ty;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                req: s3s::S3Request<$input>,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = s3s::S3Result<s3s::S3Response<$output>>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move { $map(self.$target().$name(req).await) })
            }
        )*
    };
}
