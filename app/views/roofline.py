import streamlit as st
st.title("roofline")
