"""What the screens show, without Textual: the setup form's model, a run's state from its
events, and the tail that follows a run's log (an import contract keeps Textual out)."""
