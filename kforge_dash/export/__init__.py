"""Export: RUN/ingested/ -> a TensorBoard event file and an offline W&B run (docs/CONTRACT.md, "Exports").

    history.py     steps.parquet + ranks.parquet + summary.json as one tagged history
    tensorboard.py the event file writer
    tb_findings.py summary.json findings as TensorBoard text summaries
    wandb.py       the offline run writer and `wandb sync`
    outcome.py     ExporterOutcome, ExportResult, the Exporter shape
    exporters.py   TensorBoardExporter, WandbExporter, UploadExporter; choose_exporters, run_exporters
    run.py         export_run, the library call with switches
"""
