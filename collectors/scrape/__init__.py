"""Scraping: targets, the HTTP scraper, per-target schedules and the scrape loop."""
