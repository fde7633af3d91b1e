"""The fingerprint library shipped with the package (fingerprints.json, manifest.json,
campaign.json); a package only so that wheels carry its data files. See docs/fingerprints.md."""
