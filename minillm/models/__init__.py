"""Model definitions, checkpoint loading, and the registry of architectures and bundled models."""
