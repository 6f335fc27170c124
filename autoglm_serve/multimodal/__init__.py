"""Images for the model: fetching/decoding (media), preprocessing (image_processor), prompt placeholders (prompt)."""
