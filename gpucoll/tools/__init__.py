"""Commands over the API: `gpucoll info`."""
