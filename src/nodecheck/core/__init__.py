"""The bottom layer: errors, units, limits, PCI addresses, link types, interface names, pairing, and the spec
data (data/*.toml) with its readers. Pure helpers any layer may use; they import nothing above them."""
