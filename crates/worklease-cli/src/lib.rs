//! The `worklease` command's value parsers, a library only so that the
//! fuzz targets in `fuzz/` call the very code the command runs (issue 23).
//! Not an API: hidden, and free to change in any release.

#[doc(hidden)]
pub mod values;

#[doc(hidden)]
pub mod fuzz;
