"""What the operator reads back, pure: checked specs, owned objects, revisions, Deployment and pod states."""
