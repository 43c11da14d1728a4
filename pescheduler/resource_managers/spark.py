"""placeholder"""
class SparkResourceManager:
    name = "spark"
