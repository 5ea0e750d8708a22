"""Configuration: the pydantic schema, its cross-field rules, loading and overrides."""
