"""Model artefacts: file names and paths, derived artefacts built on the driver, and the
version strings recorded in every row."""
