"""Placeholder main job until the client demo lands."""

print("genrm: workspace set up")
