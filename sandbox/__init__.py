"""Process launcher: prctl, rlimits, environment scrub, bubblewrap."""
