//! The crash loop (being written).
