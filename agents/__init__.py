"""Training, evaluation, tracking and the policy registry (imports env and policies)."""
