"""The app's screens. BACK is the one key that leaves a screen (its action_back says to where)."""

from textual.binding import Binding

BACK = Binding("escape", "back", "Back")
