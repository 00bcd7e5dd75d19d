"""Experiment presets the package ships (engineer settings, context variants V1..V6, the
guideline of module G), so an installed wheel has them. The files are links to the editable
copies under configs/engineer/, which configs load by path."""
