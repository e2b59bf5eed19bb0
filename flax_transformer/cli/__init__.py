"""What the command lines share (`common`) and decode.py's work (`translate`)."""
