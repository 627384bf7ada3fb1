"""The leaves every layer uses: settings, logs, errors, dtypes, ops, the Call, requests."""
