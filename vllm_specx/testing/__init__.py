"""Test harnesses: code that makes an engine runnable on the project's CPU test machines and is
not a way to serve. Nothing in the plugin's serving path imports this package."""
