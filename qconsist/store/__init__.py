"""The run store: run directories, their manifests, and the hashes of what they hold."""
