//! [`CheckpointData`]: what a checkpoint may be written from.

use bytes::Bytes;

/// Bytes a checkpoint is written from ([`crate::Leases::checkpoint`],
/// [`crate::runner::RunContext::checkpoint`]): owned buffers (`Bytes`,
/// `Vec<u8>`, `String`, `Box<[u8]>`) are taken without a copy; borrowed
/// ones (`&[u8]`, `&str`, `&Vec<u8>`, `&String`, `&Bytes`, `&[u8; N]`)
/// of any lifetime are copied once, so that
/// `leases.checkpoint(&token, line.as_bytes())` compiles for a `line` that
/// lives on the stack (`impl Into<Bytes>`, the signature before, needed
/// `'static` data there).
///
/// ```
/// # async fn example(leases: worklease::Leases, token: worklease::Token) -> worklease::Result<()> {
/// let progress = format!("offset={}", 42);
/// let token = leases.checkpoint(&token, progress.as_bytes()).await?; // borrowed
/// let token = leases.checkpoint(&token, progress).await?; // owned, no copy
/// # let _ = token; Ok(()) }
/// ```
pub trait CheckpointData {
    /// The bytes, as the store is given them.
    fn into_checkpoint(self) -> Bytes;
}

macro_rules! owned {
    ($($t:ty),*) => {$(
        impl CheckpointData for $t {
            fn into_checkpoint(self) -> Bytes {
                Bytes::from(self)
            }
        }
    )*};
}
owned!(Bytes, Vec<u8>, String, Box<[u8]>);

macro_rules! borrowed {
    ($($t:ty),*) => {$(
        impl CheckpointData for &$t {
            fn into_checkpoint(self) -> Bytes {
                let bytes: &[u8] = self.as_ref();
                Bytes::copy_from_slice(bytes)
            }
        }
    )*};
}
borrowed!([u8], str, Vec<u8>, String, Bytes);

impl<const N: usize> CheckpointData for &[u8; N] {
    fn into_checkpoint(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl<const N: usize> CheckpointData for [u8; N] {
    fn into_checkpoint(self) -> Bytes {
        Bytes::copy_from_slice(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_gives_the_same_bytes() {
        let text = String::from("offset=7");
        let want = Bytes::from_static(b"offset=7");
        assert_eq!(text.as_bytes().into_checkpoint(), want);
        assert_eq!(text.as_str().into_checkpoint(), want);
        assert_eq!((&text).into_checkpoint(), want);
        assert_eq!((&text.clone().into_bytes()).into_checkpoint(), want);
        assert_eq!(text.clone().into_bytes().into_checkpoint(), want);
        assert_eq!(text.clone().into_checkpoint(), want);
        assert_eq!((&want).into_checkpoint(), want);
        assert_eq!(b"offset=7".into_checkpoint(), want);
        assert_eq!((*b"offset=7").into_checkpoint(), want);
        assert_eq!(Box::<[u8]>::from(&b"offset=7"[..]).into_checkpoint(), want);
    }
}
