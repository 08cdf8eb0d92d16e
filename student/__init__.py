"""The camera student: image encoder, policy head, DAgger distillation, deploy-time wrapper."""
