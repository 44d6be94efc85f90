"""place"""
