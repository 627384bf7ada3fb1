"""From a checked Call to an engine: numbering, ordering, the cost-table choice, failures."""
