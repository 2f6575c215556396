"""What tests import or start: fault injection (faultlib) and small worker programs."""
