//! V4.1 image handling: token-count arithmetic, preprocessing and fetching.
