//! Protocol requests -> `ConversationRequest`.
