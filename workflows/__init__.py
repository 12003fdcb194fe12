"""End-to-end jobs built on mgpu's primitives, each run as ``mgpu run NAME``."""
